"""The test tiers (docs/developing/testing.md#tiers), marked here from where a test lives and the
fixtures it uses, so that no test file has to say it:

* ``e2e``: the test needs the local control plane (the ``control_plane`` or ``living`` fixture,
  however indirectly), lives under ``tests/e2e/`` (real ``kproxy run`` processes, kubectl, Go
  tools), or lives under ``tests/adversarial/`` and uses a fixture of its own (a private control
  plane, kproxy processes): there, only what needs nothing started is fast, and
  ``tests/adversarial/recorded/`` (the corpus against the recorded upstream, in-process);
* ``living``: under ``tests/e2e/living/`` (its own control plane with the controllers and KWOK);
* ``helm``: runs helm (the ``helm`` fixture, the chart test modules ``test_helm*.py``, or marked
  ``@pytest.mark.helm`` by hand);
* ``fuzz``: the differential fuzzer's run (``tests/adversarial/test_fuzz.py``).

A test with none of them is in the fast tier (``make check``): unit and in-process tests, the
examples, whatever runs without a control plane. ``living``, ``helm`` and ``fuzz`` tests are
``e2e`` too (they need a control plane); ``make e2e`` runs the rest of ``e2e``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["kproxy.testing.pytest_plugin"]

TESTS = Path(__file__).resolve().parent
#: The tiers other than the fast one; ``make check`` runs ``-m "not (...)"`` of them.
SLOW_TIERS = ("e2e", "living", "helm", "fuzz")
_CONTROL_PLANE_FIXTURES = frozenset({"control_plane", "living"})


def tiers(item: pytest.Item) -> set[str]:
    """The tiers ``item`` belongs to, from its path and its fixtures (``fixturenames`` is the
    closure: a fixture that needs ``control_plane`` makes its tests need it)."""
    path = Path(str(item.path)).resolve()
    parts = path.relative_to(TESTS).parts if path.is_relative_to(TESTS) else ()
    fixtures = set(getattr(item, "fixturenames", ()))
    out: set[str] = set()
    if parts[:2] == ("e2e", "living"):
        out.add("living")
    if "helm" in fixtures or (parts[:1] == ("e2e",) and path.name.startswith("test_helm")):
        out.add("helm")
    if parts == ("adversarial", "test_fuzz.py"):
        out.add("fuzz")
    in_process = parts[:2] == ("adversarial", "recorded")
    own_processes = parts[:1] == ("e2e",) or (
        parts[:1] == ("adversarial",) and not in_process and _uses_own_fixture(item)
    )
    if out or own_processes or fixtures & _CONTROL_PLANE_FIXTURES:
        out.add("e2e")
    return out


def _uses_own_fixture(item: pytest.Item) -> bool:
    """Whether a fixture ``item`` needs is defined in a test module or conftest of the repository
    (pytest's and plugins' fixtures have no ``baseid``)."""
    info = getattr(item, "_fixtureinfo", None)
    defs = getattr(info, "name2fixturedefs", {})
    return any(getattr(d, "baseid", "") for ds in defs.values() for d in ds)


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by these marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        have = {m.name for m in item.iter_markers()}
        for tier in sorted(tiers(item) - have):
            item.add_marker(tier)
