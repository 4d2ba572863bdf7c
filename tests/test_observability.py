"""deploy/observability: the Grafana dashboard's shape, the alert rules, and that every PromQL expression
parses (Prometheus's grammar, promql-parser) and names only metrics the coordinator registers.

No PyPI package ships promtool, so the rules are checked here: YAML structure,
each ``expr`` parsed, ``for`` a Prometheus duration, ``labels.severity``, and
``annotations`` with a summary and a description whose templates are balanced.
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import promql_parser
import pytest
import yaml

from fencepost.coordinator.telemetry.endpoint import MetricsEndpoint

from .conftest import REPO

OBSERVABILITY = REPO / "deploy" / "observability"
DASHBOARD = OBSERVABILITY / "dashboard.json"
ALERTS = OBSERVABILITY / "alerts.yaml"

#: Series named in the expressions that the coordinator does not register:
#: ``up`` is made by Prometheus for each scrape target, and the guards'
#: counters are registered by the client library's fencing guards (an app's
#: registry), not by the coordinator (checked against a guard's registry below).
NOT_FROM_COORDINATOR = {"up", "fencepost_guard_stale_rejections_total", "fencepost_guard_token_ahead_total"}

#: Grafana's variables, replaced by values of the same kind before parsing.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$job": ".*"}

_TARGET = {
    "type": "object",
    "required": ["refId", "expr", "legendFormat"],
    "properties": {"refId": {"type": "string", "pattern": "^[A-Z]$"}, "expr": {"type": "string", "minLength": 1}},
}
DASHBOARD_SCHEMA = {
    "type": "object",
    "required": ["title", "uid", "schemaVersion", "panels", "templating", "time"],
    "properties": {
        "uid": {"type": "string", "pattern": "^[a-z0-9-]{1,40}$"},
        "schemaVersion": {"type": "integer", "minimum": 30},
        "templating": {"type": "object", "required": ["list"], "properties": {"list": {"type": "array", "items": {
            "type": "object", "required": ["name", "type"]}}}},
        "panels": {"type": "array", "minItems": 8, "items": {
            "type": "object",
            "required": ["id", "type", "title", "datasource", "gridPos", "targets"],
            "properties": {
                "id": {"type": "integer", "minimum": 1},
                "type": {"enum": ["timeseries", "stat", "gauge", "table", "bargauge"]},
                "title": {"type": "string", "minLength": 3},
                "description": {"type": "string"},
                "datasource": {"type": "object", "required": ["type", "uid"],
                               "properties": {"type": {"const": "prometheus"}, "uid": {"const": "${datasource}"}}},
                "gridPos": {"type": "object", "required": ["x", "y", "w", "h"], "properties": {
                    "x": {"type": "integer", "minimum": 0, "maximum": 23},
                    "w": {"type": "integer", "minimum": 1, "maximum": 24},
                    "y": {"type": "integer", "minimum": 0}, "h": {"type": "integer", "minimum": 1}}},
                "targets": {"type": "array", "minItems": 1, "items": _TARGET},
            },
        }},
    },
}


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())  # type: ignore[no-any-return]


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def _dashboard_exprs() -> list[str]:
    return [t["expr"] for panel in _dashboard()["panels"] for t in panel["targets"]]


def _parse(expr: str) -> Any:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"an unknown Grafana variable in {expr!r}"
    return promql_parser.parse(expr)


def metric_names(expr: str) -> set[str]:
    """The metric names of every vector selector in ``expr`` (``{__name__=...}`` is not used here)."""
    names: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"a selector without a metric name in {expr!r}"
            names.add(node.name)

    promql_parser.walk(_parse(expr), visit)
    return names


def registered_series() -> set[str]:
    """Every series name the coordinator's /metrics can expose (counters' ``_total``, histograms' parts)."""
    endpoint = MetricsEndpoint("127.0.0.1:0")  # not started: only its registry
    names: set[str] = set()
    for family in endpoint.registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"],
                    "summary": ["_sum", "_count", ""]}.get(family.type, [""])
        names.update(family.name + suffix for suffix in suffixes)
        names.update(sample.name for sample in family.samples)
    return names


def test_metric_names_finds_selectors_not_functions_or_labels() -> None:
    """The name extraction sees the selectors of a nested expression and nothing else."""
    expr = ('histogram_quantile(0.9, sum by (le, job) (rate(a_bucket{job="x",le!="1"}[5m]))) '
            '/ on() group_left b_total unless c offset 1h')
    assert metric_names(expr) == {"a_bucket", "b_total", "c"}


def test_dashboard_has_the_shape_of_a_grafana_dashboard() -> None:
    """The dashboard validates against the schema above; panel ids unique; panels do not overlap."""
    dashboard = _dashboard()
    jsonschema.validate(dashboard, DASHBOARD_SCHEMA)
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), ids
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "job"} <= variables


def test_dashboard_covers_the_questions_of_issue_10() -> None:
    """Grants, waits, holds, hold and hand-off times, leases and waiters, losses, refusals, guard rejections, etcd
    latency and errors each have a panel."""
    used = set().union(*(metric_names(e) for e in _dashboard_exprs()))
    assert {"fencepost_grants_total", "fencepost_releases_total", "fencepost_acquire_wait_seconds_bucket",
            "fencepost_holds", "fencepost_hold_seconds_bucket", "fencepost_handoff_seconds_count",
            "fencepost_handoff_seconds_bucket", "fencepost_leases", "fencepost_losses_total",
            "fencepost_watched_holds", "fencepost_waiting_acquires", "fencepost_refusals_total",
            "fencepost_guard_stale_rejections_total", "fencepost_etcd_request_seconds_bucket",
            "fencepost_etcd_errors_total"} <= used


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_every_expression_parses_and_names_only_exported_metrics(source: str) -> None:
    """Each expression parses as PromQL and every metric it names is registered (or explicitly allowed)."""
    exprs = _dashboard_exprs() if source == "dashboard" else [rule["expr"] for rule in _rules()]
    known = registered_series() | NOT_FROM_COORDINATOR
    unknown = {(name, expr) for expr in exprs for name in metric_names(expr) if name not in known}
    assert not unknown, sorted(unknown)


def test_registered_series_include_the_coordinator_metrics() -> None:
    """The comparison set is the real registry: the lock and gRPC metrics and the process collector."""
    names = registered_series()
    assert {"fencepost_grants_total", "fencepost_acquire_wait_seconds_bucket", "grpc_server_handled_total",
            "process_cpu_seconds_total"} <= names
    assert "fencepost_guard_stale_rejections_total" not in names  # from the guards; allowed by name only


def test_the_guard_series_allowed_by_name_are_the_ones_a_guard_registers() -> None:
    """The guards' counters named in the rules are what a guard given a registry exports."""
    import sqlite3

    from prometheus_client import CollectorRegistry

    from fencepost.client.fencing import SqlGuard

    registry = CollectorRegistry()
    SqlGuard(sqlite3.connect(":memory:"), "t", "id", metrics=registry).conn.close()
    exported = {sample.name for family in registry.collect() for sample in family.samples}
    assert NOT_FROM_COORDINATOR - {"up"} <= exported, exported


_DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


def test_alert_rules_are_well_formed() -> None:
    """Groups of rules with unique names, a parsed expr, a duration for `for`, a severity, summary and description."""
    doc = yaml.safe_load(ALERTS.read_text())
    assert set(doc) == {"groups"}
    for group in doc["groups"]:
        assert set(group) <= {"name", "interval", "rules"} and group["name"] and group["rules"]
    rules = _rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)), names
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}, rule["alert"]
        assert re.fullmatch(r"Fencepost[A-Za-z]+", rule["alert"])
        _parse(rule["expr"])
        if "for" in rule:
            assert _DURATION.match(rule["for"]), rule
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]
        for text in rule["annotations"].values():
            assert text.count("{{") == text.count("}}"), (rule["alert"], text)


def test_alert_rules_cover_the_issue() -> None:
    """Not serving, etcd errors, lost holds rising, stale writes refused and long waits each have a rule."""
    used = {rule["alert"]: metric_names(rule["expr"]) for rule in _rules()}
    assert "up" in used["FencepostCoordinatorDown"]
    assert "fencepost_etcd_errors_total" in used["FencepostEtcdErrors"]
    assert used["FencepostLeaseLossesRising"] == {"fencepost_losses_total"}
    assert used["FencepostStaleWriteRejected"] == {"fencepost_guard_stale_rejections_total"}
    assert used["FencepostStoredTokenAhead"] == {"fencepost_guard_token_ahead_total"}
    assert "fencepost_acquire_wait_seconds_bucket" in used["FencepostAcquireWaitHigh"]


def test_a_broken_expression_is_caught() -> None:
    """The parser refuses an unbalanced expression (the check above can fail)."""
    with pytest.raises(ValueError):
        _parse("sum(rate(fencepost_grants_total[5m])")
