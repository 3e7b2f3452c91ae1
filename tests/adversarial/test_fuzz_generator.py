"""The fuzzer's generator alone (no cluster): every request of a long run can be built, and a
request is the same bytes whenever its seed and index are the same (what makes a report a repro)."""

from __future__ import annotations

from .fuzz import generate


def test_generator_builds_every_request_and_is_reproducible() -> None:
    first = [generate(7, i).render("fzk-abcdef", f"fz{i}") for i in range(20_000)]
    assert [generate(7, i).render("fzk-abcdef", f"fz{i}") for i in range(0, 20_000, 97)] == first[::97]
    assert len(set(first)) > 15_000  # mutations, not one request over and over
