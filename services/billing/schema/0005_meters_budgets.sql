-- Meters cut while they run, the price an allocation was quoted, budgets and their webhook calls.
--
-- meters.cut_until: usage recorded up to here (NULL: nothing yet). A cut (handlers/meters.py) or the stop
-- records [coalesce(cut_until, started_at), until) and moves cut_until to until, under the meter row's lock.
-- A meter already stopped had all its usage recorded at its stop (keyed by the old scheme, one record per UTC
-- hour): cut_until = stopped_at, so a redelivered stop records nothing under the new keys.
-- meters.price: the allocation's quoted price (contracts.PriceSnapshot as JSON; NULL: the list in force).
ALTER TABLE meters ADD COLUMN cut_until timestamptz, ADD COLUMN price jsonb;
UPDATE meters SET cut_until = stopped_at WHERE stopped_at IS NOT NULL;
CREATE INDEX meters_to_cut ON meters (coalesce(cut_until, started_at)) WHERE stopped_at IS NULL;

-- One budget per tenant; a deleted budget stays as a tombstone (amount_minor NULL) so version keeps growing.
-- webhook_secret lives here and in webhook_deliveries only: it is never in an event or a log line.
CREATE TABLE budgets (
    tenant_id      uuid PRIMARY KEY,
    amount_minor   bigint CHECK (amount_minor > 0),
    currency       char(3),
    thresholds     jsonb NOT NULL DEFAULT '[]',
    webhook_url    text,
    webhook_secret text,
    version        bigint NOT NULL DEFAULT 1,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    CHECK ((amount_minor IS NULL) = (currency IS NULL))
);

-- A threshold is crossed once per tenant and month: the row is the proof it was.
CREATE TABLE budget_crossings (
    tenant_id      uuid NOT NULL,
    month          date NOT NULL,
    percent        int NOT NULL,
    basis          text NOT NULL CHECK (basis IN ('actual', 'forecast')),
    budget_minor   bigint NOT NULL,
    spend_minor    bigint NOT NULL,
    forecast_minor bigint NOT NULL,
    currency       char(3) NOT NULL,
    crossed_at     timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, month, percent, basis)
);

-- Webhook calls: pending until a 2xx answer (delivered) or the attempts run out (failed). A caller claims a
-- pending row by moving next_attempt_at past its call's timeout (a lease), so replicas never call twice at once.
CREATE TABLE webhook_deliveries (
    id              uuid PRIMARY KEY,
    tenant_id       uuid NOT NULL,
    event           text NOT NULL,
    url             text NOT NULL,
    secret          text,
    body            jsonb NOT NULL,
    status          text NOT NULL CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts        int NOT NULL DEFAULT 0,
    last_status     int,
    last_error      text,
    next_attempt_at timestamptz,
    delivered_at    timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
