"""The platform's dashboards, one per subject: the fleet, scheduling per tenant, sagas, the message kit, billing
and the gateway's API. Every query reads a metric some service exports (tests/contract/test_grafana.py holds
them to it); docs/observability.md lists the metrics.

Gauges the scheduler keeps are read from the active replica only (``and on (instance) tessera_scheduler_leader
== 1``): a standby keeps what it last set.
"""
from __future__ import annotations

from .panels import bars, dashboard, query_variable, row, stat, table, timeseries

RATE = "$__rate_interval"
LEADER = "and on (instance) (tessera_scheduler_leader == 1)"
CLOSED_OPEN = [{"type": "value", "options": {"0": {"text": "closed", "color": "green"},
                                             "1": {"text": "OPEN", "color": "red"}}}]


def quantile(q: float, metric: str, by: str, selector: str = "") -> str:
    """The ``q`` quantile of histogram ``metric`` per ``by`` labels, over the panel's rate interval."""
    return (f"histogram_quantile({q}, sum by ({by}, le) "
            f"(rate({metric}_bucket{{{selector}}}[{RATE}])))")


def quantiles(metric: str, by: str, selector: str = "", legend: str = "") -> list[tuple[str, str]]:
    """p50 and p99 of ``metric`` per ``by``, legends naming which."""
    return [(quantile(0.5, metric, by, selector), f"p50 {legend}".strip()),
            (quantile(0.99, metric, by, selector), f"p99 {legend}".strip())]


def fleet() -> dict:
    return dashboard("tessera-fleet", "Tessera / Fleet",
                     "Nodes by health state, GPUs by what their agents report, instances per node, the automatic-"
                     "cordon breaker and how fast a failing node is cordoned.", [
        row("Nodes"),
        bars("Nodes by health state", [(f"sum by (state) (tessera_health_nodes {LEADER})", "{{state}}")], w=8,
             description="Nodes the scheduler's health monitor watches, by state (healthy, suspect, cordoned…)."),
        stat("Cordon breaker", [(f"max by (pool) (tessera_health_breaker_open {LEADER})", "{{pool}}")], w=8,
             mappings=CLOSED_OPEN, thresholds=[(None, "green"), (1, "red")],
             description="Open: too many nodes of the pool failed at once; automatic cordons stop until an "
                         "operator looks."),
        stat("Services up", [("sum by (job) (up)", "{{job}}")], w=8, thresholds=[(None, "red"), (1, "green")],
             description="Scrape targets answering /metrics, per job."),
        row("GPUs"),
        timeseries("GPUs by state", [
            ('count(DCGM_FI_DEV_GPU_TEMP{allocation!=""}) or vector(0)', "allocated"),
            ('count(DCGM_FI_DEV_GPU_TEMP{allocation=""}) or vector(0)', "free"),
            ("count(DCGM_FI_DEV_XID_ERRORS > 0) or vector(0)", "XID error"),
            ("count(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL > 0) or vector(0)", "ECC double-bit"),
            ("count(DCGM_FI_DEV_RETIRED_PENDING > 0) or vector(0)", "pages pending retirement")], "short",
            description="GPUs as the node agents report them on each heartbeat: held by an allocation or free, "
                        "and those with a fault."),
        table("GPUs with a fault", [("max by (node, gpu) (DCGM_FI_DEV_XID_ERRORS) > 0", "XID"),
                                    ("max by (node, gpu) (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL) > 0", "ECC DBE")],
              description="The last XID error and the volatile double-bit ECC errors, per GPU (none: empty)."),
        row("Instances"),
        timeseries("Instances per node", [("sum by (node_id) (tessera_node_instances)", "{{node_id}}")], "short",
                   stack=True, description="Instances each node's driver reports running."),
        timeseries("Detection to cordon", quantiles("tessera_health_detection_to_cordon_seconds", "condition",
                                                    legend="{{condition}}"), "s",
                   description="From the start of a condition (an alert, a lost heartbeat) to the automatic cordon."),
    ])


def scheduling() -> dict:
    tenant, pool = 'tenant=~"$tenant"', 'pool=~"$pool"'
    return dashboard("tessera-scheduling", "Tessera / Scheduling per tenant",
                     "Queue wait and pending requests per tenant, decision latency, preemptions, and each pool's "
                     "utilisation and fragmentation.", [
        row("Tenants"),
        timeseries("Queue wait p50", [(quantile(0.5, "tessera_scheduler_queue_wait_seconds", "tenant", tenant),
                                       "{{tenant}}")], "s",
                   description="Time a request waited in the queue before it was placed, median per tenant."),
        timeseries("Queue wait p99", [(quantile(0.99, "tessera_scheduler_queue_wait_seconds", "tenant", tenant),
                                       "{{tenant}}")], "s"),
        timeseries("Pending requests", [(f"sum by (tenant) (tessera_scheduler_pending{{{tenant}}} {LEADER})",
                                         "{{tenant}}")], "short", stack=True,
                   description="Requests waiting in the queue, per tenant."),
        timeseries("Decision latency", quantiles("tessera_scheduler_decision_seconds", "outcome", tenant,
                                                 "{{outcome}}"), "s",
                   description="Reserve command handled to decision, per outcome."),
        timeseries("Decisions", [(f"sum by (outcome) (rate(tessera_scheduler_decision_seconds_count{{{tenant}}}"
                                  f"[{RATE}]))", "{{outcome}}")], "ops", stack=True),
        timeseries("Preemptions", [(f"sum by (pool) (increase(tessera_scheduler_preemptions_total{{{pool}}}"
                                    f"[{RATE}]))", "{{pool}}")], "short",
                   description="Preemption notices issued, per pool."),
        row("Pools"),
        timeseries("Utilisation", [(f"max by (pool, gpu_model) (tessera_scheduler_pool_utilisation_ratio{{{pool}}}"
                                    f" {LEADER})", "{{pool}} {{gpu_model}}")], "percentunit", min_=0, max_=1,
                   description="Held GPUs / schedulable GPUs."),
        timeseries("Fragmentation", [(f"max by (pool, gpu_model) (tessera_scheduler_fragmentation_ratio{{{pool}}}"
                                      f" {LEADER})", "{{pool}} {{gpu_model}}")], "percentunit", min_=0, max_=1,
                   description="Share of free GPUs on nodes that cannot serve an 8-GPU request."),
        stat("Active scheduler", [("max by (instance) (tessera_scheduler_leader)", "{{instance}}")], w=24,
             mappings=[{"type": "value", "options": {"0": {"text": "standby"}, "1": {"text": "active"}}}]),
    ], [query_variable("tenant", "label_values(tessera_scheduler_pending, tenant)"),
        query_variable("pool", "label_values(tessera_scheduler_pool_utilisation_ratio, pool)")])


def sagas() -> dict:
    saga = 'service="saga"'
    return dashboard("tessera-sagas", "Tessera / Sagas",
                     "The saga coordinator's work, read from the message kit's metrics of service saga: the "
                     "replies and events it handles, failed steps, its handler time, and how fast an interrupted "
                     "allocation runs again.", [
        timeseries("Saga messages handled", [(f"sum by (type) (rate(tessera_messages_consumed_total{{{saga}}}"
                                              f"[{RATE}]))", "{{type}}")], "ops", stack=True,
                   description="Step replies and events the saga handled, per type."),
        timeseries("Failed steps", [(f'sum by (type) (rate(tessera_messages_consumed_total{{{saga}, '
                                     f'type=~".+_failed"}}[{RATE}]))', "{{type}}")], "ops",
                   description="Step replies saying a participant refused (types ending in _failed): each starts a "
                               "compensation."),
        timeseries("Handler time p99", [(quantile(0.99, "tessera_handler_seconds", "type", saga), "{{type}}")], "s"),
        timeseries("Handler outcomes", [(f'sum by (outcome) (rate(tessera_messages_consumed_total{{{saga}, '
                                         f'outcome!="ok"}}[{RATE}]))', "{{outcome}}")], "ops",
                   description="Messages not handled ok: duplicates, refusals, errors (retried)."),
        timeseries("Commands sent", [(f"sum(rate(tessera_outbox_published_total{{{saga}}}[{RATE}]))", "published")],
                   "ops", description="Outbox rows the saga published: its step commands and events."),
        timeseries("Saga consumer lag", [(f"sum by (consumer) (tessera_consumer_pending_messages{{{saga}}})",
                                          "{{consumer}}")], "short"),
        timeseries("Dead letters", [(f"sum by (reason) (increase(tessera_dead_letters_total{{{saga}}}[{RATE}]))",
                                     "{{reason}}")], "short"),
        timeseries("Reschedule gap", quantiles("tessera_allocation_reschedule_gap_seconds", "job"), "s",
                   description="Interrupted → ACTIVE again on another node."),
    ])


def message_kit() -> dict:
    svc = 'service=~"$service"'
    return dashboard("tessera-message-kit", "Tessera / Message kit",
                     "Every service's consumers and outbox: lag, throughput, handler time, refusals and dead "
                     "letters.", [
        timeseries("Consumer lag", [(f"max by (service, consumer) (tessera_consumer_pending_messages{{{svc}}})",
                                     "{{consumer}}")], "short",
                   description="Messages the stream holds for each durable consumer, as of its last fetch."),
        timeseries("Messages consumed", [(f"sum by (service, outcome) (rate(tessera_messages_consumed_total{{{svc}}}"
                                          f"[{RATE}]))", "{{service}} {{outcome}}")], "ops", stack=True),
        timeseries("Handler time p99 (top 10)",
                   [(f"topk(10, {quantile(0.99, 'tessera_handler_seconds', 'service, type', svc)})",
                     "{{service}} {{type}}")], "s"),
        timeseries("Handler time p50", [(quantile(0.5, "tessera_handler_seconds", "service", svc), "{{service}}")],
                   "s"),
        timeseries("Outbox published", [(f"sum by (service) (rate(tessera_outbox_published_total{{{svc}}}[{RATE}]))",
                                         "{{service}}")], "ops", stack=True),
        timeseries("Errors and refusals", [(f'sum by (service, type, outcome) (rate(tessera_messages_consumed_total'
                                            f'{{{svc}, outcome=~"error|refused"}}[{RATE}]))',
                                            "{{service}} {{type}} {{outcome}}")], "ops"),
        timeseries("Dead letters by reason", [(f"sum by (service, reason) (increase(tessera_dead_letters_total"
                                               f"{{{svc}}}[{RATE}]))", "{{service}} {{reason}}")], "short"),
        stat("Dead letters in range", [(f"sum by (reason) (increase(tessera_dead_letters_total{{{svc}}}[$__range]))",
                                        "{{reason}}")], w=12, h=8, thresholds=[(None, "green"), (1, "red")]),
    ], [query_variable("service", "label_values(tessera_messages_consumed_total, service)")])


def billing() -> dict:
    bill = 'service="billing"'
    return dashboard("tessera-billing", "Tessera / Billing",
                     "Usage rated into the ledger, amounts charged, invoices, and billing's own message handling.", [
        timeseries("Usage rated", [(f"sum by (kind, rated) (rate(tessera_billing_usage_rated_total[{RATE}]))",
                                    "{{kind}} rated={{rated}}")], "ops", stack=True,
                   description="Usage records rated and appended to the ledger (rated=false: no price applied)."),
        stat("Unrated share", [(f'sum(rate(tessera_billing_usage_rated_total{{rated="false"}}[{RATE}])) / '
                                f"sum(rate(tessera_billing_usage_rated_total[{RATE}]))", "unrated")], "percentunit",
             w=12, h=8, thresholds=[(None, "green"), (0.01, "red")],
             description="Records recorded without a price (no version in force, no matching price)."),
        timeseries("Charged per hour", [("sum by (currency) (increase(tessera_billing_charged_minor_total[1h]))",
                                         "{{currency}}")], "short",
                   description="Amounts charged to the ledger over the last hour, in the currency's minor units."),
        timeseries("Invoices", [(f"sum by (action) (increase(tessera_billing_invoices_total[{RATE}]))",
                                 "{{action}}")], "short"),
        timeseries("Billing handler time p99", [(quantile(0.99, "tessera_handler_seconds", "type", bill),
                                                 "{{type}}")], "s"),
        timeseries("Billing consumer lag", [(f"sum by (consumer) (tessera_consumer_pending_messages{{{bill}}})",
                                             "{{consumer}}")], "short"),
    ])


def api() -> dict:
    gw = 'service="gateway"'
    return dashboard("tessera-api", "Tessera / Gateway API",
                     "The public API: requests by status, latency per route, server errors and audit failures.", [
        timeseries("Requests by status", [(f"sum by (status) (rate(tessera_http_requests_total{{{gw}}}[{RATE}]))",
                                           "{{status}}")], "reqps", stack=True),
        timeseries("Server error ratio", [(f'sum(rate(tessera_http_requests_total{{{gw}, status=~"5.."}}[{RATE}])) '
                                           f"/ sum(rate(tessera_http_requests_total{{{gw}}}[{RATE}]))", "5xx")],
                   "percentunit", min_=0),
        timeseries("Latency p99 by route (top 10)",
                   [(f"topk(10, {quantile(0.99, 'tessera_http_request_seconds', 'method, route', gw)})",
                     "{{method}} {{route}}")], "s"),
        timeseries("Audit write failures", [(f"sum(increase(tessera_audit_write_failures_total[{RATE}]))",
                                             "failures")], "short",
                   description="Mutating requests whose audit record could not be written."),
    ])
