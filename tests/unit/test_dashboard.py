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
