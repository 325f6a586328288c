"""The Grafana dashboards (deploy/grafana) read what the services export, and show what they promise.

Every PromQL expression of every panel and template variable names only series some service exports: the names
come from scanning services/ and shared/ for the prometheus_client metrics they define (``Counter("name"``,
``Gauge(``, ``Histogram(``, ``Summary(``) and expanding each as prometheus_client exposes it. A renamed or
removed metric therefore fails here, not as an empty panel in production.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
import yaml

from deploy.grafana.generate import DASHBOARDS, rendered
from deploy.grafana.gpu import DCGM_PANELS

from .deploy_files import DEPLOY_NAME, compose_schema

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
BOARDS = sorted(DASHBOARDS.glob("*.json"))

# --- what the code exports ---------------------------------------------------------------------------------------
_DEFINED = re.compile(r"\b(Counter|Gauge|Histogram|Summary)\(\s*[\"']([a-zA-Z_:][\w:]*)[\"']")
# per scrape target, Prometheus itself writes these
SCRAPE_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


def series_of(kind: str, name: str) -> set[str]:
    """The series names prometheus_client exposes for a metric defined as ``kind(name, ...)``."""
    if kind == "Counter":   # Counter("x") and Counter("x_total") both expose x_total
        base = name.removesuffix("_total")
        return {f"{base}_total", f"{base}_created"}
    if kind == "Histogram":
        return {f"{name}_bucket", f"{name}_sum", f"{name}_count", f"{name}_created"}
    if kind == "Summary":
        return {name, f"{name}_sum", f"{name}_count", f"{name}_created"}
    return {name}


def exported_series() -> set[str]:
    found = set()
    for path in [*ROOT.joinpath("services").rglob("*.py"), *ROOT.joinpath("shared").rglob("*.py")]:
        for kind, name in _DEFINED.findall(path.read_text()):
            found |= series_of(kind, name)
    return found


# --- a PromQL tokenizer (enough to find the metric names) --------------------------------------------------------
FUNCTIONS = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values", "group",
    "rate", "irate", "increase", "delta", "idelta", "deriv", "predict_linear", "resets", "changes",
    "histogram_quantile", "abs", "ceil", "floor", "round", "clamp", "clamp_min", "clamp_max", "exp", "ln", "log2",
    "log10", "sqrt", "vector", "scalar", "time", "timestamp", "absent", "absent_over_time", "label_replace",
    "label_join", "sort", "sort_desc", "sum_over_time", "avg_over_time", "max_over_time", "min_over_time",
    "count_over_time", "last_over_time", "quantile_over_time", "present_over_time",
}
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
            "offset", "inf", "nan"}
_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w.:])([a-zA-Z_:][\w:]*)(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """The metric names ``expr`` selects: identifiers standing alone or before ``{``, once strings, label
    matchers, ranges, Grafana variables and label lists (by, on, ...) are taken out; a called identifier must be
    a PromQL function."""
    s = _STRING.sub('""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)            # label matchers (their strings are gone: no brace left inside)
    s = re.sub(r"\[[^\]]*\]", " ", s)           # ranges and subqueries: durations, $__rate_interval
    s = re.sub(r"\$\{?\w+(?::\w+)?\}?", " ", s)  # Grafana variables
    s = _LABEL_LIST.sub(" ", s)
    names = set()
    for ident, called in _IDENT.findall(s):
        if ident.lower() in KEYWORDS:      # "and (x)" calls nothing
            continue
        if called:
            assert ident in FUNCTIONS, f"{ident}() is not a PromQL function ({expr})"
        else:
            names.add(ident)
    return names


def variable_expr(query: str) -> str | None:
    """The series selector of a ``label_values(selector, label)`` variable (None: ``label_values(label)``)."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", query)
    return m.group(1) if m else None


def test_the_tokenizer_finds_metrics_and_nothing_else():
    expr = ('histogram_quantile(0.99, sum by (tenant, le) (rate(a_seconds_bucket{tenant=~"$tenant", x="b{c}(d)"}'
            '[$__rate_interval]))) and on (instance) (leader == 1) / ignoring(pool) group_left c_total offset 5m'
            ' * 1e6 + topk(10, d:recorded:rate5m) or vector(0)')
    assert metric_names(expr) == {"a_seconds_bucket", "leader", "c_total", "d:recorded:rate5m"}
    assert metric_names('count(g{allocation!=""} > 0) or sum without (gpu) (${metric_var})') == {"g"}
    with pytest.raises(AssertionError, match="not a PromQL function"):
        metric_names("made_up(x)")
    assert variable_expr('label_values(g{node=~"$node"}, gpu)') == 'g{node=~"$node"}'
    assert variable_expr("label_values(gpu)") is None


def test_a_counter_exposes_total_and_a_histogram_its_buckets_not_its_bare_name():
    assert series_of("Counter", "x_total") == series_of("Counter", "x") == {"x_total", "x_created"}
    assert "h" not in series_of("Histogram", "h") and "h_bucket" in series_of("Histogram", "h")


# --- the dashboards ------------------------------------------------------------------------------------------------
def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _queries(board: dict) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and every query variable of ``board``."""
    out = [(f"panel {p['title']!r}", t["expr"]) for p in board["panels"] for t in p.get("targets", [])]
    for v in board["templating"]["list"]:
        if v["type"] == "query" and (expr := variable_expr(v["query"]["query"])):
            out.append((f"variable {v['name']}", expr))
    return out


def test_the_committed_json_is_what_the_code_builds():
    assert {p.name: p.read_text() for p in BOARDS} == rendered(), "run: python -m deploy.grafana.generate"


@pytest.mark.parametrize("path", BOARDS, ids=lambda p: p.stem)
def test_every_metric_a_dashboard_queries_is_exported_by_some_service(path):
    exported = exported_series() | SCRAPE_SERIES
    missing = {f"{where}: {name}" for where, expr in _queries(_load(path)) for name in metric_names(expr)
               if name not in exported}
    assert missing == set()


@pytest.mark.parametrize("path", BOARDS, ids=lambda p: p.stem)
def test_every_dashboard_reads_the_datasource_variable_with_units_and_a_valid_grid(path):
    board = _load(path)
    assert board["schemaVersion"] >= 36 and board["uid"].startswith("tessera-") and board["title"]
    [ds] = [v for v in board["templating"]["list"] if v["name"] == "datasource"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for p in board["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        if p["type"] == "row":
            continue
        assert p["targets"] and p["fieldConfig"]["defaults"]["unit"], p["title"]
        assert p["datasource"]["uid"] == "${datasource}", p["title"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"]), p["title"]
    for v in board["templating"]["list"]:
        if v["type"] == "query":
            assert v["datasource"]["uid"] == "${datasource}", v["name"]


def test_dashboard_uids_are_unique():
    uids = [_load(p)["uid"] for p in BOARDS]
    assert len(uids) == len(set(uids))


PROMISED = {
    "fleet": {"Nodes by health state", "GPUs by state", "Instances per node", "Cordon breaker"},
    "scheduling": {"Queue wait p50", "Queue wait p99", "Pending requests", "Decision latency", "Preemptions",
                   "Utilisation", "Fragmentation"},
    "sagas": {"Saga messages handled", "Failed steps", "Handler time p99", "Dead letters"},
    "message-kit": {"Consumer lag", "Dead letters by reason", "Outbox published", "Handler time p99 (top 10)"},
    "billing": {"Usage rated", "Charged per hour", "Invoices"},
    "api": {"Requests by status", "Latency p99 by route (top 10)"},
    "gpu-health": set(DCGM_PANELS),
}


def test_each_subject_has_its_dashboard_with_the_panels_it_promises():
    titles = {p.stem: {panel["title"] for panel in _load(p)["panels"]} for p in BOARDS}
    assert set(titles) == set(PROMISED)
    assert {name: PROMISED[name] - titles[name] for name in PROMISED} == dict.fromkeys(PROMISED, set())


def test_gpu_health_has_the_eight_panels_and_the_variables_of_nvidias_dcgm_dashboard():
    board = _load(DASHBOARDS / "gpu-health.json")
    assert len(DCGM_PANELS) == 8
    kinds = {p["title"]: p["type"] for p in board["panels"]}
    assert {t: kinds[t] for t in DCGM_PANELS} == {
        "GPU Temperature": "timeseries", "GPU Avg. Temp": "gauge", "GPU Power Usage": "timeseries",
        "GPU Power Total": "gauge", "GPU SM Clocks": "timeseries", "GPU Utilization": "timeseries",
        "Tensor Core Utilization": "timeseries", "GPU Framebuffer Mem Used": "timeseries"}
    assert {"datasource", "instance", "gpu"} <= {v["name"] for v in board["templating"]["list"]}


# --- provisioning -------------------------------------------------------------------------------------------------
def test_grafana_provisioning_loads_the_dashboards_folder_from_prometheus():
    overlay = yaml.safe_load((GRAFANA / "compose.yaml").read_text())
    mounts = dict(v.split(":")[:2] for v in overlay["services"]["grafana"]["volumes"])   # source -> target
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards.yaml").read_text())["providers"][0]
    assert mounts["../grafana/dashboards"] == provider["options"]["path"]
    assert mounts["../grafana/provisioning/dashboards.yaml"].startswith("/etc/grafana/provisioning/dashboards/")
    assert mounts["../grafana/provisioning/datasources.yaml"].startswith("/etc/grafana/provisioning/datasources/")
    [source] = yaml.safe_load((GRAFANA / "provisioning" / "datasources.yaml").read_text())["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    compose_dir = ROOT / "deploy" / "compose"   # an overlay's paths resolve from the first file's folder
    assert all((compose_dir / local).resolve().exists() for local in mounts if local.startswith(".."))


def test_the_compose_overlay_is_valid_and_prometheus_scrapes_every_service():
    schema = compose_schema()
    overlay = yaml.safe_load((GRAFANA / "compose.yaml").read_text())
    errors = [e.message for e in jsonschema.validators.validator_for(schema)(schema).iter_errors(overlay)]
    assert errors == []
    config = yaml.safe_load((GRAFANA / "prometheus.yml").read_text())
    targets = {t for job in config["scrape_configs"] for s in job["static_configs"] for t in s["targets"]}
    assert targets == {f"{name}:8080" for name in DEPLOY_NAME.values()}
