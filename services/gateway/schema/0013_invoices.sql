-- Invoices as billing publishes them (billing.invoice_changed), and what the FOCUS export needs of each rated
-- usage record (billing.usage_rated).

-- One row per invoice: the latest document (a newer version replaces it, an older or equal one is ignored).
-- doc is the whole InvoiceDoc as published; the other columns are what lists filter and page on.
CREATE TABLE IF NOT EXISTS invoices_view (
    invoice_id   uuid PRIMARY KEY,
    tenant_id    uuid NOT NULL,
    number       text NOT NULL,
    period_start timestamptz NOT NULL,
    status       text NOT NULL CHECK (status IN ('draft', 'finalized')),
    version      bigint NOT NULL,
    doc          jsonb NOT NULL,
    updated_at   timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS invoices_view_by_tenant ON invoices_view (tenant_id, period_start DESC, invoice_id DESC);
CREATE INDEX IF NOT EXISTS invoices_view_by_period ON invoices_view (period_start DESC, invoice_id DESC);

-- The invoice a usage record was billed on, whether it is a correction (late usage of a finalized period,
-- billed on a later invoice), its amount at list price, the list price per unit-hour and the SKU price id.
-- Rows projected before this migration have none of them (the export falls back to the billed amount).
ALTER TABLE usage_view ADD COLUMN IF NOT EXISTS invoice_id uuid;
ALTER TABLE usage_view ADD COLUMN IF NOT EXISTS correction boolean NOT NULL DEFAULT false;
ALTER TABLE usage_view ADD COLUMN IF NOT EXISTS list_amount_minor bigint;
ALTER TABLE usage_view ADD COLUMN IF NOT EXISTS micros_per_unit_hour bigint;
ALTER TABLE usage_view ADD COLUMN IF NOT EXISTS sku_price_id text;
CREATE INDEX IF NOT EXISTS usage_view_corrections ON usage_view (invoice_id) WHERE correction;
-- the provider-wide FOCUS export reads a month of every tenant's usage
CREATE INDEX IF NOT EXISTS usage_view_period ON usage_view (period_start);
