"""The README and docs/ point only at things that exist.

Every relative link in README.md and docs/**/*.md resolves to a file or directory of the
repository, and its ``#anchor``, when the target is Markdown, to one of that file's headings
(GitHub's slugs). Every repository path written in inline code (`kproxy/...`, `tests/...`,
`benchmarks/...`, `deploy/...`, `tools/...`, `docs/...`, `examples/...`) exists; paths with
placeholders or globs (`<name>`, `*`) are checked up to the placeholder.

The code points only at things that exist too: in the comments and docstrings of kproxy/, tests/,
benchmarks/ and examples/, every Markdown file named (a page under docs/ or README.md, with an
optional `#anchor`) exists and has that heading, and no comment cites a document outside the repository (an
issue tracker, a design note, a numbered section of a reference that is not here): the apiserver's
behaviours are cited by their Go source path or by docs/developing/wire-reference.md.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
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

CODE_DIRS = ("kproxy", "tests", "benchmarks", "examples")
SOURCES = sorted(p for d in CODE_DIRS for p in (REPO / d).rglob("*.py") if ".venv" not in p.parts)
#: A Markdown file named in a comment, with its optional anchor: docs/using/watchcache.md#watches-from-the-cache.
MD_REF = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*[\w.-]+\.md)(?:#([\w-]+))?")
#: Citations of what the repository does not hold. The Kubernetes behaviours are cited by their Go
#: source path or by the project's wire reference; a README section by its file and anchor.
OUTSIDE = {
    r"\bthe issue\b": "an issue tracker",
    r"wire doc": "a wire document outside the repository",
    r"k8s-wire-behaviour": "a wire document outside the repository",
    r"DESIGN\.md|\bDESIGN's\b": "a design document outside the repository",
    r"§|(?<!RFC \d\d\d\d )\bsection \d+\.\d+": "a numbered section of a document outside the repository",
    r"\bREADME(?!\.md#)(?:\.md)?(?:'s\b|,| \"|\))": "a README section by name, not by file and anchor",
    r"\(issue \d+\)": "this project's issue tracker",
}
#: Files other than Python whose comments users read: the commented example config.
COMMENTED = [REPO / "config.example.yaml"]


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


def _comments_and_docstrings(source: str) -> list[tuple[int, str]]:
    """Every comment and every module, class and function docstring of ``source``, with its line."""
    out = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = node.body[0] if node.body else None
            if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) and isinstance(doc.value.value, str):
                out.append((doc.lineno, doc.value.value))
    return sorted(out)


def _broken_md_refs(text: str, here: Path) -> list[str]:
    """The Markdown files (and anchors) ``text`` names that do not exist. A path is read from the
    repository's root, then from the directory of the file that names it (a results file beside a
    benchmark)."""
    broken = []
    for path, anchor in MD_REF.findall(text):
        dest = next((d for d in (REPO / path, here.parent / path) if d.is_file()), None)
        if dest is None:
            broken.append(f"{path}: no such file")
        elif anchor and anchor not in _anchors(dest):
            broken.append(f"{path}#{anchor}: no such heading")
    return broken


def _outside_citations(text: str) -> list[str]:
    return [f"{m.group(0)!r} cites {why}" for pattern, why in OUTSIDE.items() for m in re.finditer(pattern, text)]


@pytest.mark.parametrize("py", SOURCES, ids=_rel)
def test_code_comments_cite_what_exists(py: Path) -> None:
    problems = []
    for line, text in _comments_and_docstrings(py.read_text()):
        found = _broken_md_refs(text, py)
        if py != Path(__file__).resolve():  # this file names the phrases it forbids
            found += _outside_citations(text)
        problems += [f"{_rel(py)}:{line}: {p}" for p in found]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", COMMENTED, ids=_rel)
def test_config_comments_cite_what_exists(path: Path) -> None:
    problems = []
    for line, text in enumerate(path.read_text().splitlines(), 1):
        comment = text.partition("#")[2] if text.lstrip().startswith("#") else ""
        problems += [f"{_rel(path)}:{line}: {p}" for p in _broken_md_refs(comment, path) + _outside_citations(comment)]
    assert not problems, "\n".join(problems)


def test_the_code_checks_see_comments_docstrings_and_citations(tmp_path: Path) -> None:
    """The comment checks themselves, on a sample: a broken file, anchor or outside citation is found,
    a string that is neither comment nor docstring is not read, an RFC's section is allowed."""
    sample = (
        '"""Module doc: see docs/nope.md and README.md#quick-start."""\n'
        "X = 'docs/also-nope.md is data, not a citation'\n"
        "def f():\n"
        '    """Per the wire doc, RFC 9110 section 12.5.3, and section 3.5."""\n'
        "    return 1  # README.md#no-such-heading; as the issue asks; the issuer is fine\n"
        "# README.md#limits is a citation, (README, impersonate) names a section the README may lose\n"
    )
    texts = _comments_and_docstrings(sample)
    assert [line for line, _ in texts] == [1, 4, 5, 6]
    broken = [b for _, t in texts for b in _broken_md_refs(t, tmp_path / "x.py")]
    assert broken == ["docs/nope.md: no such file", "README.md#no-such-heading: no such heading"]
    outside = [o.split(" cites")[0] for _, t in texts for o in _outside_citations(t)]
    assert sorted(outside) == sorted(["'wire doc'", "'section 3.5'", "'the issue'", "'README,'"])
    assert [
        o.split(" cites")[0] for o in _outside_citations('# --- dryrun (issue 7): see README "The dryrun filter"')
    ] == [
        "'README \"'",
        "'(issue 7)'",
    ]


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
