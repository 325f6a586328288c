CREATE TABLE allocations (
    id          uuid PRIMARY KEY,
    tenant_id   uuid NOT NULL,
    user_id     uuid NOT NULL,
    name        text NOT NULL,
    shape       text NOT NULL,
    gpu_count   int  NOT NULL CHECK (gpu_count > 0),
    volume_gb   int  NOT NULL CHECK (volume_gb >= 0),
    labels      jsonb NOT NULL DEFAULT '{}'::jsonb,
    state       text NOT NULL CHECK (state IN ('REQUESTED', 'PROVISIONING', 'ACTIVE', 'RELEASING', 'RELEASED', 'FAILED')),
    node_id     uuid,
    failed_step text,
    reason      text,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    CHECK (state <> 'ACTIVE' OR node_id IS NOT NULL),
    CHECK (state <> 'FAILED' OR (failed_step IS NOT NULL AND reason IS NOT NULL))
);
CREATE INDEX allocations_tenant ON allocations (tenant_id, created_at);
