CREATE TABLE meters (
    id            uuid PRIMARY KEY,
    allocation_id uuid NOT NULL UNIQUE,
    tenant_id     uuid NOT NULL,
    shape         text NOT NULL,
    gpu_count     int  NOT NULL CHECK (gpu_count > 0),
    started_at    timestamptz NOT NULL,
    stopped_at    timestamptz,
    gpu_seconds   double precision,
    CHECK (stopped_at IS NULL OR stopped_at >= started_at)
);
CREATE INDEX meters_running ON meters (tenant_id) WHERE stopped_at IS NULL;
