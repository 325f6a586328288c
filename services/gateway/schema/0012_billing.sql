-- What billing publishes, for reads: price-list versions (billing.price_list_published), their refusals
-- (billing.price_list_rejected) and rated usage records (billing.usage_rated), one row per usage key.
CREATE TABLE price_lists_view (
    version        text PRIMARY KEY,
    currency       char(3) NOT NULL,
    effective_from timestamptz NOT NULL,
    body           jsonb NOT NULL,
    published_by   uuid NOT NULL,
    published_at   timestamptz NOT NULL
);

CREATE TABLE price_list_rejections (
    event_id     uuid PRIMARY KEY,
    version      text NOT NULL,
    reason       text NOT NULL,
    field        text,
    requested_by uuid NOT NULL,
    at           timestamptz NOT NULL
);
CREATE INDEX price_list_rejections_at ON price_list_rejections (at DESC);

CREATE TABLE usage_view (
    usage_key      text PRIMARY KEY,
    kind           text NOT NULL,
    tenant_id      uuid NOT NULL,
    user_id        uuid,
    allocation_id  uuid,
    volume_id      uuid,
    shape          text,
    gpu_model      text,
    pool           text,
    spot           boolean NOT NULL,
    storage_class  text,
    period_start   timestamptz NOT NULL,
    period_end     timestamptz NOT NULL,
    quantity       numeric NOT NULL,
    amount_minor   bigint NOT NULL,
    currency       char(3) NOT NULL,
    rated          boolean NOT NULL,
    price_version  text
);
CREATE INDEX usage_view_tenant ON usage_view (tenant_id, period_start);
