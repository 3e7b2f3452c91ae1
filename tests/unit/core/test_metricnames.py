"""The metric naming scheme: a renamed counter counts under its old name too, for one release."""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kproxy.core.metricnames import RENAMED, counter


def exported(registry: CollectorRegistry) -> dict[str, tuple[str, dict[tuple[tuple[str, str], ...], float]]]:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        values = {tuple(sorted(s.labels.items())): s.value for s in fam.samples if s.name.endswith("_total")}
        out[fam.name] = (fam.documentation, values)
    return out


def test_a_renamed_counter_counts_under_both_names() -> None:
    reg = CollectorRegistry()
    c = counter("kproxy_transcode_responses_total", "Responses transcoded.", ["shape"], registry=reg)
    c.labels("list").inc()
    c.labels("list").inc(2)
    c.labels("object").inc()
    got = exported(reg)
    new_doc, new = got["kproxy_transcode_responses"]
    old_doc, old = got["kproxy_transcoded_responses"]
    assert new == old == {(("shape", "list"),): 3.0, (("shape", "object"),): 1.0}
    assert new_doc == "Responses transcoded."
    assert old_doc.startswith("Deprecated: renamed kproxy_transcode_responses_total")


def test_a_counter_that_was_not_renamed_is_exported_once() -> None:
    reg = CollectorRegistry()
    counter("kproxy_transcode_errors_total", "Errors.", registry=reg).inc()
    assert {n for n in exported(reg) if not n.endswith("_created")} == {"kproxy_transcode_errors"}


def test_the_new_names_follow_the_scheme() -> None:
    for old, new in RENAMED.items():
        assert new.startswith("kproxy_") and new.endswith("_total") and old != new
        assert "_in_bytes" not in new and "_out_bytes" not in new and not new.startswith("kproxy_transcoded_")
