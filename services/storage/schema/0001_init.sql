-- A row per tenant that has ever asked for a volume: the lock that makes "check quota, then insert"
-- atomic. max_gb NULL means the service's default quota (TESSERA_STORAGE_DEFAULT_QUOTA_GB) applies.
CREATE TABLE tenant_quotas (
    tenant_id uuid PRIMARY KEY,
    max_gb    bigint CHECK (max_gb >= 0)
);

CREATE TABLE volumes (
    id            uuid PRIMARY KEY,
    allocation_id uuid NOT NULL UNIQUE,
    tenant_id     uuid NOT NULL,
    size_gb       int  NOT NULL CHECK (size_gb > 0),
    created_at    timestamptz NOT NULL
);
CREATE INDEX volumes_tenant ON volumes (tenant_id);
