"""Billing's Prometheus metrics (default registry, served on the runtime's /metrics).

Defined at import (as prometheus_client expects), they connect to nothing. Each is counted once what it counts
has committed: a rolled-back unit of work charged nothing."""
from __future__ import annotations

from prometheus_client import Counter

USAGE_RATED = Counter("tessera_billing_usage_rated_total",
                      "Usage records rated and appended to the ledger (rated=false: no price applied)",
                      ["kind", "rated"])
CHARGED = Counter("tessera_billing_charged_minor_total",
                  "Amounts the ledger charged, in the currency's minor units", ["currency"])
INVOICES = Counter("tessera_billing_invoices_total",
                   "Invoices finalized, and changed invoices published as billing.invoice_changed", ["action"])
