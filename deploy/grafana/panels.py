"""Grafana dashboard JSON, built from a few plain functions (no SDK): panels, template variables and a board
that lays its panels out row by row.

Every panel queries the ``${datasource}`` variable (a Prometheus data source picked when the board is opened),
so the boards carry no data-source uid of one Grafana. The JSON is what Grafana 10/11 writes for the same
panels (schemaVersion 39); ``generate`` writes it under dashboards/.
"""
from __future__ import annotations

from typing import Any

SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
WIDTH = 24   # Grafana's grid


def target(expr: str, legend: str = "", ref: str = "A", *, instant: bool = False) -> dict[str, Any]:
    """One PromQL query of a panel."""
    return {"refId": ref, "datasource": DATASOURCE, "editorMode": "code", "expr": expr,
            "legendFormat": legend or "__auto", "range": not instant, "instant": instant}


def _targets(queries: list[tuple[str, str]] | str, instant: bool = False) -> list[dict[str, Any]]:
    if isinstance(queries, str):
        queries = [(queries, "")]
    return [target(expr, legend, chr(ord("A") + i), instant=instant) for i, (expr, legend) in enumerate(queries)]


def _thresholds(steps: list[tuple[float | None, str]] | None) -> dict[str, Any]:
    steps = steps or [(None, "green")]
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}


def _panel(kind: str, title: str, queries, unit: str, *, w: int, h: int, description: str = "",
           thresholds=None, min_: float | None = None, max_: float | None = None, mappings=None,
           options: dict | None = None, custom: dict | None = None, instant: bool = False) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": unit, "thresholds": _thresholds(thresholds), "mappings": mappings or [],
                                "color": {"mode": "palette-classic" if kind == "timeseries" else "thresholds"}}
    if min_ is not None:
        defaults["min"] = min_
    if max_ is not None:
        defaults["max"] = max_
    if custom:
        defaults["custom"] = custom
    return {"type": kind, "title": title, "description": description, "datasource": DATASOURCE,
            "gridPos": {"w": w, "h": h}, "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": options or {}, "targets": _targets(queries, instant)}


def timeseries(title: str, queries, unit: str, *, w: int = 12, h: int = 8, stack: bool = False,
               **kw: Any) -> dict[str, Any]:
    """Lines over time, a table legend with mean, last and max."""
    custom = {"drawStyle": "line", "lineWidth": 2, "fillOpacity": 25 if stack else 10, "showPoints": "never",
              "spanNulls": False, "stacking": {"mode": "normal" if stack else "none", "group": "A"}}
    options = {"legend": {"displayMode": "table", "placement": "bottom", "showLegend": True,
                          "calcs": ["mean", "lastNotNull", "max"]},
               "tooltip": {"mode": "multi", "sort": "desc"}}
    return _panel("timeseries", title, queries, unit, w=w, h=h, options=options, custom=custom, **kw)


def _reduced(calc: str) -> dict[str, Any]:
    return {"reduceOptions": {"calcs": [calc], "fields": "", "values": False}}


def stat(title: str, queries, unit: str = "short", *, w: int = 6, h: int = 5, calc: str = "lastNotNull",
         **kw: Any) -> dict[str, Any]:
    """A number per series, coloured by its thresholds."""
    options = {**_reduced(calc), "colorMode": "background", "graphMode": "area", "textMode": "value_and_name",
               "justifyMode": "auto", "orientation": "auto"}
    return _panel("stat", title, queries, unit, w=w, h=h, options=options, **kw)


def gauge(title: str, queries, unit: str, *, w: int = 6, h: int = 8, calc: str = "lastNotNull",
          **kw: Any) -> dict[str, Any]:
    """A dial between ``min_`` and ``max_``."""
    options = {**_reduced(calc), "showThresholdLabels": False, "showThresholdMarkers": True, "orientation": "auto"}
    return _panel("gauge", title, queries, unit, w=w, h=h, options=options, **kw)


def bars(title: str, queries, unit: str = "short", *, w: int = 12, h: int = 8, **kw: Any) -> dict[str, Any]:
    """One horizontal bar per series (its last value)."""
    options = {**_reduced("lastNotNull"), "displayMode": "gradient", "orientation": "horizontal",
               "showUnfilled": True, "valueMode": "color"}
    return _panel("bargauge", title, queries, unit, w=w, h=h, options=options, instant=True, **kw)


def table(title: str, queries, unit: str = "short", *, w: int = 12, h: int = 8, **kw: Any) -> dict[str, Any]:
    """The series' labels and current value, one row each."""
    panel = _panel("table", title, queries, unit, w=w, h=h, options={"showHeader": True}, instant=True, **kw)
    for t in panel["targets"]:
        t["format"] = "table"
    merge = [{"id": "merge", "options": {}}] if len(panel["targets"]) > 1 else []   # one row per series
    panel["transformations"] = [*merge, {"id": "organize", "options": {"excludeByName": {"Time": True}}}]
    return panel


def row(title: str) -> dict[str, Any]:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "gridPos": {"w": WIDTH, "h": 1}}


# --- template variables ----------------------------------------------------------------------------------------
def datasource_variable() -> dict[str, Any]:
    return {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
            "current": {}, "hide": 0, "refresh": 1, "regex": "", "includeAll": False, "multi": False}


def query_variable(name: str, query: str, label: str = "") -> dict[str, Any]:
    """A multi-value variable from ``label_values(...)``, All by default (matching everything: ``=~"$name"``)."""
    return {"name": name, "label": label or name, "type": "query", "datasource": DATASOURCE,
            "definition": query, "query": {"query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
            "includeAll": True, "multi": True, "allValue": ".*", "current": {"text": "All", "value": "$__all"},
            "refresh": 2, "sort": 1, "hide": 0, "regex": ""}


# --- the board ---------------------------------------------------------------------------------------------------
def _lay_out(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Number the panels and place them left to right, a new line when the grid's width is used up (a row
    always starts one)."""
    x = y = line_h = 0
    for i, p in enumerate(panels, start=1):
        w, h = p["gridPos"]["w"], p["gridPos"]["h"]
        if x + w > WIDTH or (p["type"] == "row" and x > 0):
            x, y, line_h = 0, y + line_h, 0
        p["id"], p["gridPos"] = i, {"h": h, "w": w, "x": x, "y": y}
        x, line_h = x + w, max(line_h, h)
    return panels


def dashboard(uid: str, title: str, description: str, panels: list[dict[str, Any]],
              variables: list[dict[str, Any]] = (), *, refresh: str = "30s") -> dict[str, Any]:
    return {
        "uid": uid, "title": title, "description": description, "tags": ["tessera"],
        "schemaVersion": SCHEMA_VERSION, "version": 1, "editable": True, "graphTooltip": 1,
        "time": {"from": "now-1h", "to": "now"}, "refresh": refresh, "timezone": "utc", "fiscalYearStartMonth": 0,
        "links": [{"title": "Tessera", "type": "dashboards", "tags": ["tessera"], "asDropdown": True}],
        "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                  "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                  "name": "Annotations & Alerts", "type": "dashboard"}]},
        "templating": {"list": [datasource_variable(), *variables]},
        "panels": _lay_out(panels),
    }
