"""``deploy/grafana/callbridge.json``: what ``deploy/grafana/build_dashboard.py`` builds with Grafana's Foundation SDK
(builders generated from Grafana's schemas), shaped as Grafana's dashboard schema asks, and every query over metrics
the bridge exports, grouped by labels those metrics have."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from callbridge.bridge.engine_admin import EnginePoolCollector
from callbridge.bridge.metrics import BridgeMetrics

pytestmark = pytest.mark.core

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy" / "grafana" / "callbridge.json"
SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count"), "info": ("_info",)}


def exported() -> dict[str, set[str]]:
    """Every series name the bridge's ``/metrics`` can carry → its labels."""
    series: dict[str, set[str]] = {}
    metrics = BridgeMetrics(CollectorRegistry())
    for metric in vars(metrics).values():
        if isinstance(metric, MetricWrapperBase):
            for suffix in SUFFIXES[metric._type]:
                series[metric._name + suffix] = set(metric._labelnames) | ({"le"} if suffix == "_bucket" else set())
    pool = SimpleNamespace(status=list, endpoints=SimpleNamespace(failovers={}))
    for family in EnginePoolCollector(pool).collect():  # type: ignore[arg-type]
        for suffix in SUFFIXES[family.type]:
            series[family.name + suffix] = set(family._labelnames)  # type: ignore[attr-defined]
    return series


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_dashboard", ROOT / "deploy" / "grafana" / "build_dashboard.py")
    assert spec is not None and spec.loader is not None
    module = sys.modules["build_dashboard"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_json_is_what_the_builder_builds() -> None:
    assert DASHBOARD.read_text(encoding="utf-8") == builder().rendered(), "run python deploy/grafana/build_dashboard.py"


def test_the_dashboard_has_the_shape_grafanas_schema_asks() -> None:
    board = dashboard()
    assert board["title"] and 8 <= len(board["uid"]) <= 40
    assert isinstance(board["schemaVersion"], int) and isinstance(board["editable"], bool) and board["graphTooltip"] in (0, 1, 2)
    (variable,) = board["templating"]["list"]
    assert (variable["type"], variable["name"], variable["query"]) == ("datasource", "datasource", "prometheus")
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) for i in ids)
    for panel in board["panels"]:
        position = panel["gridPos"]
        assert all(isinstance(position[k], int) for k in "hwxy") and position["x"] + position["w"] <= 24, panel["title"]
        assert panel["type"] in ("row", "stat", "timeseries"), panel["type"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        assert panel["description"], panel["title"]


def test_every_query_names_exported_metrics_by_their_labels() -> None:
    series = exported()
    queries = [(panel["title"], target["expr"]) for panel in dashboard()["panels"] for target in panel.get("targets", [])]
    assert len(queries) >= 20
    named: set[str] = set()
    for title, expr in queries:
        metrics = re.findall(r"\bcallbridge_[a-z0-9_]+", expr)
        assert metrics, (title, expr)
        for metric in metrics:
            assert metric in series, f"{title}: {metric} is not exported"
        labels = {label.strip() for group in re.findall(r"by \(([^)]*)\)", expr) for label in group.split(",")}
        labels |= set(re.findall(r"([a-z_]+)!?=~?\"", expr))
        known = set().union(*(series[metric] for metric in metrics))
        assert labels <= known, f"{title}: {sorted(labels - known)} not labels of {metrics}"
        named.update(metrics)
    for wanted in ("callbridge_calls_active", "callbridge_turn_latency_seconds_bucket", "callbridge_barge_ins_total",
                   "callbridge_streams_refused_total", "callbridge_engine_endpoint_sessions", "callbridge_event_loop_lag_seconds_bucket"):  # fmt: skip
        assert wanted in named, wanted


def test_a_query_over_a_metric_not_exported_is_caught() -> None:
    assert "callbridge_calls_up" not in exported() and "callbridge_calls_active" in exported()
