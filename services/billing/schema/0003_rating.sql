-- Rating: price-list versions, usage records (idempotent on their source event), and what a meter knows.
--
-- meters gain the facts usage is split and priced by (user, GPU model, pool, spot); a meter started before
-- this migration has none of them (NULL / false) and is priced by shape or the default price.
ALTER TABLE meters ADD COLUMN user_id uuid, ADD COLUMN gpu_model text, ADD COLUMN pool text,
                   ADD COLUMN spot boolean NOT NULL DEFAULT false;

-- One row per published version; the body is the wire document (services.billing.contracts.PriceListDoc).
CREATE TABLE price_list_versions (
    version        text PRIMARY KEY,
    currency       char(3) NOT NULL,
    effective_from timestamptz NOT NULL UNIQUE,
    body           jsonb NOT NULL,
    published_by   uuid NOT NULL,
    published_at   timestamptz NOT NULL DEFAULT now()
);

-- A usage record counts once: UNIQUE (source, event_id); a redelivered or replayed event inserts nothing.
-- source 'meter': event_id '<meter id>@<hour start>' (a meter's interval split at UTC hours);
-- source 'storage': event_id '<volume id>@<report time>' (the interval since the volume's previous report).
CREATE TABLE usage_records (
    source         text NOT NULL CHECK (source IN ('meter', 'storage')),
    event_id       text NOT NULL,
    kind           text NOT NULL CHECK (kind IN ('gpu', 'storage')),
    tenant_id      uuid NOT NULL,
    user_id        uuid,
    allocation_id  uuid,
    volume_id      uuid,
    shape          text,
    gpu_model      text,
    pool           text,
    spot           boolean NOT NULL DEFAULT false,
    gpu_count      int,
    storage_class  text,
    period_start   timestamptz NOT NULL,
    period_end     timestamptz NOT NULL CHECK (period_end >= period_start),
    quantity       numeric NOT NULL CHECK (quantity >= 0),   -- GPU-seconds or byte-seconds, exact
    amount_minor   bigint NOT NULL,
    currency       char(3) NOT NULL,
    rated          boolean NOT NULL,
    price_version  text,
    sku_price_id   text,
    reason         text,
    ledger_seq     bigint NOT NULL,
    recorded_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, event_id)
);
CREATE INDEX usage_records_tenant ON usage_records (tenant_id, period_start);

-- The last usage report seen per volume (storage is billed on the bytes used between two reports) and the
-- class and owner a volume has (storage.volume_changed), which the reports do not carry.
CREATE TABLE storage_volumes (
    volume_id      uuid PRIMARY KEY,
    tenant_id      uuid NOT NULL,
    user_id        uuid,
    storage_class  text,             -- NULL until storage.volume_changed names it
    last_used_bytes bigint,
    last_report_at timestamptz
);
