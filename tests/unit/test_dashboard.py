"""The Grafana dashboard is well-formed: unique ids, panels inside the 24-column grid and not
overlapping, every query on the dashboard's data source and job/instance variables."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "kproxy-dashboard.json"


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def queries(dash: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def test_panels_have_unique_ids_and_fit_the_grid_without_overlap() -> None:
    panels = load()["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = p["title"]


def test_every_query_uses_the_variables() -> None:
    dash = load()
    names = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "job", "instance"} <= names
    for p in dash["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            # Every kproxy series a panel reads is narrowed to the chosen job and instance.
            for selector in re.findall(r"kproxy_\w+(\{[^}]*\})?", t["expr"]):
                assert 'job=~"$job"' in selector and 'instance=~"$instance"' in selector, t["expr"]


def test_queries_are_balanced() -> None:
    for expr in queries(load()):
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr
        assert expr.count("[") == expr.count("]"), expr


ROW_OF_FILTER = {
    "compression": "Compression filter",
    "watchcache": "Watch cache filter",
    "dryrun": "Dryrun filter",
    "validation": "Validation filter",
    "transcode": "Transcode filter",
}


def test_one_row_per_built_in_filter_each_querying_its_own_metrics() -> None:
    from kproxy.filters import available

    dash = load()
    assert set(ROW_OF_FILTER) == {n for n, target in available().items() if target.startswith("kproxy.filters.")}
    rows = [p for p in dash["panels"] if p["type"] == "row"]
    for name, title in ROW_OF_FILTER.items():
        (row,) = [r for r in rows if r["title"] == title]
        below = [p for p in dash["panels"] if p["type"] != "row" and p["gridPos"]["y"] > row["gridPos"]["y"]]
        nxt = min((r["gridPos"]["y"] for r in rows if r["gridPos"]["y"] > row["gridPos"]["y"]), default=10**6)
        exprs = " ".join(t["expr"] for p in below if p["gridPos"]["y"] < nxt for t in p["targets"])
        assert f"kproxy_{name}_" in exprs, title


def test_every_queried_metric_is_documented_and_process_metrics_are_narrowed() -> None:
    """The e2e test_metrics_conventions checks each queried metric against a running kproxy's
    /metrics; here, that each is documented (docs/monitoring.md or a filter's page)."""
    docs_dir = DASHBOARD.parents[2] / "docs"
    docs = "\n".join(p.read_text() for p in [docs_dir / "monitoring.md", *(docs_dir / "using").glob("*.md")])
    for expr in queries(load()):
        for name in re.findall(r"\b((?:kproxy|process)_\w+?)(?:_bucket|_sum|_count)?\{", expr):
            assert name in docs or name.removesuffix("_total") in docs, name
        for selector in re.findall(r"process_\w+(\{[^}]*\})", expr):
            assert 'job=~"$job"' in selector and 'instance=~"$instance"' in selector, expr
