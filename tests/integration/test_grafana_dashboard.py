"""The Grafana dashboard deploy/grafana/corepin.json against the metrics corepin exports.

The exported names come from the metric classes themselves (agent, NRI plugin, controller,
scheduler/extender, webhook), each on a registry of its own, read back through the Prometheus
exposition a scrape gets (`_total`, `_bucket`, `_sum`, `_count` as the client writes them); their
label names from the metrics modules' source. Every expression of the dashboard (panels and
variables) must name only exported series and only labels those series carry (or the target
labels Prometheus adds), every metric family the agent and the controller export that the
dashboard is meant to show must be on it, and the layout must hold together (unique ids,
panels that do not overlap, the data source variable everywhere).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from corepin.agent.cluster.controller.metrics import ControllerMetrics
from corepin.agent.cluster.metrics import PlacementMetrics
from corepin.agent.node.metrics import AgentMetrics, NriMetrics
from corepin.api.webhook.metrics import WebhookMetrics
from corepin.enforcement.resctrl.classes import ResctrlSamples
from support.paths import DEPLOY, REPO

DASHBOARD = DEPLOY / "grafana" / "corepin.json"
METRIC_MODULES = [
    REPO / "src/corepin/agent/node/metrics.py",
    REPO / "src/corepin/agent/cluster/metrics.py",
    REPO / "src/corepin/agent/cluster/controller/metrics.py",
    REPO / "src/corepin/api/webhook/metrics.py",
]
# labels Prometheus puts on every series of a target
TARGET_LABELS = {"instance", "job"}
METRIC_CALLS = {
    "Counter",
    "Gauge",
    "Histogram",
    "Summary",
    "CounterMetricFamily",
    "GaugeMetricFamily",
    "HistogramMetricFamily",
}
SUFFIXES = ("_total", "_created", "_bucket", "_sum", "_count")
# what the dashboard exists to show (issue 20): each must be on it
REQUIRED = {
    "corepin_shared_pool_cpus",
    "corepin_exclusive_cpus",
    "corepin_allocated_cpus",
    "corepin_pinning_requests_total",
    "corepin_pinning_errors_total",
    "corepin_pod_event_to_pinned_seconds_bucket",
    "corepin_reconcile_duration_seconds_bucket",
    "corepin_cgroup_writes_total",
    "corepin_watch_restarts_total",
    "corepin_be_suppressed_cpus",
    "corepin_cpu_burst_changes_total",
    "corepin_rebalance_advised_total",
    "corepin_rebalance_moves_total",
    "corepin_rebalance_move_seconds_bucket",
    "corepin_controller_reservations_total",
    "corepin_controller_leader",
}


# ---------------------------------------------------------------------- what the code exports
def registries() -> Iterator[CollectorRegistry]:
    agent = AgentMetrics()
    agent.watch_resctrl(lambda: ResctrlSamples([], []))
    yield agent.registry
    yield NriMetrics().registry
    yield ControllerMetrics().registry
    yield PlacementMetrics().registry
    yield WebhookMetrics().registry


def series_of(family: str, kind: str) -> set[str]:
    """The series names a scrape shows for one family of this type."""
    if kind == "counter":
        return {f"{family}_total", f"{family}_created"}
    if kind in ("histogram", "summary"):
        return {f"{family}_{s}" for s in ("bucket", "sum", "count", "created")} - (
            {f"{family}_bucket"} if kind == "summary" else set()
        )
    return {family}


def exported() -> dict[str, str]:
    """Every series name the processes export, mapped to its family."""
    out: dict[str, str] = {}
    for registry in registries():
        text = generate_latest(registry).decode()
        for family in text_string_to_metric_families(text):
            for name in series_of(family.name, family.type):
                out[name] = family.name
    return out


def base(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def literal_strings(node: ast.expr | None) -> list[str] | None:
    if isinstance(node, (ast.List, ast.Tuple)) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    ):
        return [e.value for e in node.elts if isinstance(e, ast.Constant)]
    return None


def declared_labels() -> dict[str, set[str]]:
    """Label names of every metric the metrics modules declare, by family (read from the
    source: the calls that make them, `Counter(name, help, [labels])` or `labels=[...]`)."""
    out: dict[str, set[str]] = {}
    for module in METRIC_MODULES:
        for node in ast.walk(ast.parse(module.read_text())):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
            if called not in METRIC_CALLS or not node.args:
                continue
            first = node.args[0]
            if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                continue
            labels = literal_strings(node.args[2]) if len(node.args) > 2 else None
            for keyword in node.keywords:
                if keyword.arg in ("labels", "labelnames"):
                    labels = literal_strings(keyword.value)
            out[base(first.value)] = set(labels or [])
    return out


# ---------------------------------------------------------------------- what the dashboard asks
def load() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def expressions(dashboard: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(expression, legend) of every panel target and every query variable."""
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            yield target["expr"], target.get("legendFormat", "")
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            yield (query["query"] if isinstance(query, dict) else query), ""


METRIC = re.compile(r"\bcorepin_[a-z0-9_]+\b")


def labels_used(expr: str, legend: str) -> set[str]:
    """Label names in `by (...)`/`without (...)`, in `{name=...}` matchers, in
    label_values(metric, name) and in the legend's {{name}}."""
    used: set[str] = set()
    for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
        used |= {x.strip() for x in group.split(",") if x.strip()}
    for matchers in re.findall(r"\{([^{}]*)\}", expr):
        used |= set(re.findall(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    used |= set(re.findall(r"label_values\([^,]+,\s*([a-zA-Z_][a-zA-Z0-9_]*)\)", expr))
    used |= set(re.findall(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}", legend))
    return used


# ---------------------------------------------------------------------- tests
def test_the_metrics_modules_declare_what_the_registries_export() -> None:
    """The source reading below sees every family the classes register (else a label check
    would pass by missing a metric)."""
    families = {base(f) for f in exported().values()}
    assert families == set(declared_labels())
    assert len(families) >= 40


def test_every_expression_names_only_exported_series() -> None:
    names = exported()
    seen = 0
    for expr, _ in expressions(load()):
        found = METRIC.findall(expr)
        assert found, f"no corepin metric in {expr!r}"
        unknown = [m for m in found if m not in names]
        assert not unknown, f"{expr!r} names {unknown}, which nothing exports"
        seen += 1
    assert seen >= 30


def test_every_label_an_expression_uses_is_one_its_series_carry() -> None:
    names, labels = exported(), declared_labels()
    for expr, legend in expressions(load()):
        carried = set(TARGET_LABELS)
        for metric in METRIC.findall(expr):
            carried |= labels[names[metric]]
            if metric.endswith("_bucket"):
                carried.add("le")
        used = labels_used(expr, legend)
        assert used <= carried, f"{expr!r} uses {sorted(used - carried)}"


def test_the_dashboard_shows_the_agent_and_controller_metrics_it_is_for() -> None:
    shown = {m for expr, _ in expressions(load()) for m in METRIC.findall(expr)}
    assert REQUIRED - shown == set()
    assert not REQUIRED - set(exported())


def test_the_label_check_refuses_a_label_a_series_lacks() -> None:
    names, labels = exported(), declared_labels()
    expr = "sum by (reason) (rate(corepin_cgroup_writes_total[5m]))"
    carried = labels[names["corepin_cgroup_writes_total"]] | TARGET_LABELS
    assert labels_used(expr, "") - carried == {"reason"}
    assert "corepin_cgroup_writes" not in names  # a counter is scraped as _total


def rectangles(dashboard: dict[str, Any]) -> Iterator[tuple[int, int, int, int, str]]:
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        yield g["x"], g["y"], g["x"] + g["w"], g["y"] + g["h"], panel["title"]


def test_the_layout_holds_together() -> None:
    dashboard = load()
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    boxes = list(rectangles(dashboard))
    for i, (x0, y0, x1, y1, title) in enumerate(boxes):
        assert 0 <= x0 < x1 <= 24, title
        for a0, b0, a1, b1, other in boxes[i + 1 :]:
            assert x1 <= a0 or a1 <= x0 or y1 <= b0 or b1 <= y0, f"{title} overlaps {other}"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for panel in panels(dashboard):
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert panel["targets"] and panel.get("description"), panel["title"]


@pytest.mark.parametrize("path", [DASHBOARD], ids=["corepin.json"])
def test_the_dashboard_is_plain_json_with_a_stable_uid(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    assert dashboard["uid"] == "corepin" and dashboard["title"] == "corepin"
    assert isinstance(dashboard["schemaVersion"], int)
