"""The README and docs/ point only at things that exist.

Every relative link in README.md and docs/**/*.md resolves to a file or directory of the
repository, and its ``#anchor``, when the target is Markdown, to one of that file's headings
(GitHub's slugs). Every repository path written in inline code (`kproxy/...`, `tests/...`,
`benchmarks/...`, `deploy/...`, `tools/...`, `docs/...`, `examples/...`) exists; paths with
placeholders or globs (`<name>`, `*`) are checked up to the placeholder.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE = re.compile(r"`([^`\n]+)`")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$", re.MULTILINE)
REPO_PATH = re.compile(r"^(kproxy|tests|benchmarks|deploy|tools|docs|examples)/[\w./<>*{}-]*$")


def _prose(text: str) -> str:
    """The text outside fenced code blocks (links and paths there are examples, not references)."""
    return FENCE.sub("", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces -> '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](link) -> text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def _anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    out = set()
    for match in HEADING.finditer(_prose(path.read_text())):
        slug = _slug(match.group(2))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return frozenset(out)


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


@pytest.mark.parametrize("md", DOCS, ids=_rel)
def test_relative_links_and_anchors_resolve(md: Path) -> None:
    broken = []
    for target in LINK.findall(_prose(md.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (md.parent / file_part).resolve() if file_part else md
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {_rel(dest)}")
    assert not broken, f"{_rel(md)}: " + "; ".join(broken)


@pytest.mark.parametrize("md", DOCS, ids=_rel)
def test_repository_paths_in_code_exist(md: Path) -> None:
    missing = []
    for code in CODE.findall(_prose(md.read_text())):
        code = code.strip()
        if not REPO_PATH.match(code):
            continue
        # Check up to the first placeholder or glob: `kproxy/filters/<name>/` checks kproxy/filters.
        fixed = re.split(r"[<>*{}]", code, maxsplit=1)[0]
        fixed = fixed if fixed == code else fixed.rsplit("/", 1)[0]
        if not (REPO / fixed).exists():
            missing.append(code)
    assert not missing, f"{_rel(md)} names paths that do not exist: {missing}"


def test_the_checks_see_links_anchors_and_paths() -> None:
    """The patterns themselves, on a sample: a broken link, anchor or path would be found."""
    sample = (
        "See [a](docs/x.md#the-filter-chain) and [b](https://e.org), `kproxy/core/` and `make test`.\n"
        "```\n[c](hidden.md) `tools/hidden`\n```\n"
    )
    prose = _prose(sample)
    assert LINK.findall(prose) == ["docs/x.md#the-filter-chain", "https://e.org"]
    assert [c for c in CODE.findall(prose) if REPO_PATH.match(c)] == ["kproxy/core/"]
    assert _slug("The `transcode` filter: protobuf to the apiserver, the client's own type") == (
        "the-transcode-filter-protobuf-to-the-apiserver-the-clients-own-type"
    )
    assert _slug("Pass-through, against kubectl proxy") == "pass-through-against-kubectl-proxy"
