-- Budgets as billing publishes them (billing.budget_changed), the thresholds they crossed
-- (billing.budget_threshold_crossed), their webhook calls (billing.webhook_delivery_changed), the provider's spend
-- caps (the gateway's own: set by PUT /v1/tenants/{id}/spend-cap, checked by POST /v1/allocations) and the price
-- an allocation was quoted when requested. Depends on 0001 (allocations_view) only.

-- One row per tenant: the latest budget_changed (by version; after a deletion, by time). amount_minor null: deleted
-- (the row stays, so an older event arriving late cannot bring the budget back).
CREATE TABLE budgets_view (
    tenant_id      uuid PRIMARY KEY,
    amount_minor   bigint,
    currency       char(3),
    thresholds     jsonb NOT NULL DEFAULT '[]'::jsonb,
    webhook_url    text,
    period_start   timestamptz NOT NULL,
    spend_minor    bigint NOT NULL,
    forecast_minor bigint NOT NULL,
    crossed        jsonb NOT NULL DEFAULT '[]'::jsonb,
    version        bigint NOT NULL,
    at             timestamptz NOT NULL
);

-- A threshold is crossed once per month: the first event kept.
CREATE TABLE budget_crossings_view (
    tenant_id      uuid NOT NULL,
    period_start   timestamptz NOT NULL,
    percent        int NOT NULL,
    basis          text NOT NULL,
    period_end     timestamptz NOT NULL,
    budget_minor   bigint NOT NULL,
    spend_minor    bigint NOT NULL,
    forecast_minor bigint NOT NULL,
    currency       char(3) NOT NULL,
    at             timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, period_start, percent, basis)
);

-- One row per webhook call, replaced only by a later state (more attempts, or as many but later).
CREATE TABLE webhook_deliveries_view (
    delivery_id     uuid PRIMARY KEY,
    tenant_id       uuid NOT NULL,
    event           text NOT NULL,
    url             text NOT NULL,
    status          text NOT NULL CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts        int NOT NULL,
    last_status     int,
    last_error      text,
    next_attempt_at timestamptz,
    delivered_at    timestamptz,
    first_at        timestamptz NOT NULL,
    at              timestamptz NOT NULL
);
CREATE INDEX webhook_deliveries_view_tenant ON webhook_deliveries_view (tenant_id, first_at DESC);

-- The provider's cap on a tenant's month-to-date rated spend (one currency); checked by the gateway only.
CREATE TABLE tenant_spend_caps (
    tenant_id    uuid PRIMARY KEY,
    amount_minor bigint NOT NULL CHECK (amount_minor >= 0),
    currency     char(3) NOT NULL,
    set_by       uuid NOT NULL,
    set_at       timestamptz NOT NULL DEFAULT now()
);

-- The GPU-hour price quoted when the allocation was requested (billing.contracts.PriceSnapshot); null: none.
ALTER TABLE allocations_view ADD COLUMN IF NOT EXISTS price jsonb;
