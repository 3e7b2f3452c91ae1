"""The inventory of decisions kproxy takes from a caller's bytes (docs/security-inventory.md) names,
on every line, the test that proves kproxy agrees with the apiserver there; those tests must exist.
A line without a test, or naming one that was renamed or deleted, fails here."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
INVENTORY = REPO / "docs" / "security-inventory.md"

# tests/adversarial/test_identity.py::test_name[param] or ::Class::test_name
_REF = re.compile(r"(tests/[\w/]+\.py)((?:::\w+)+)")


def _rows() -> list[tuple[int, list[str]]]:
    rows: list[tuple[int, list[str]]] = []
    in_table = False
    for number, line in enumerate(INVENTORY.read_text().splitlines(), 1):
        if not line.startswith("|"):
            in_table = False
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not in_table:  # the header row
            in_table = True
            assert cells[-1].lower().startswith("test"), f"line {number}: an inventory table's last column is its tests"
            continue
        if set("".join(cells)) <= set("-: "):
            continue  # the separator row
        rows.append((number, cells))
    return rows


def test_the_inventory_is_linked_from_the_security_model() -> None:
    assert "security-inventory.md" in (REPO / "docs" / "security.md").read_text()


def test_every_line_names_a_test_that_exists() -> None:
    rows = _rows()
    assert len(rows) >= 50, "the inventory lost its lines"
    missing: list[str] = []
    for number, cells in rows:
        refs = _REF.findall(cells[-1])
        if not refs:
            missing.append(f"line {number}: no test named ({cells[0][:60]})")
            continue
        for path, names in refs:
            source = REPO / path
            if not source.is_file():
                missing.append(f"line {number}: {path} does not exist")
                continue
            text = source.read_text()
            for name in names.strip(":").split("::"):
                if not re.search(rf"^\s*(?:async\s+def|def|class)\s+{name}\b", text, re.M):
                    missing.append(f"line {number}: {path} defines no {name}")
    assert not missing, "\n".join(missing)


def test_every_line_names_the_code_it_must_agree_with() -> None:
    """The middle column says which apiserver or Go code (a path) the decision must agree with."""
    vague = [f"line {n}: {cells[0][:60]}" for n, cells in _rows() if len(cells) < 3 or "/" not in cells[-2]]
    assert not vague, "\n".join(vague)
