-- Tenant clusters over the tenant's allocations, and the jobs submitted to them.
CREATE TABLE clusters (
    id           uuid PRIMARY KEY,
    tenant_id    uuid NOT NULL,
    user_id      uuid NOT NULL,
    name         text NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('slurm', 'ray', 'kubernetes')),
    shape        text NOT NULL,
    gpu_count    int  NOT NULL CHECK (gpu_count > 0),
    node_count   int  NOT NULL CHECK (node_count > 0),
    network_id   uuid,
    pool         text,
    tolerations  text[] NOT NULL DEFAULT '{}',
    priority     int  NOT NULL DEFAULT 0,
    spot         boolean NOT NULL DEFAULT false,
    autoscaling  jsonb,
    state        text NOT NULL,
    reason       text,
    driver       text,
    handle       jsonb,              -- what the driver knows a started cluster by (ClusterHandle)
    version      bigint NOT NULL DEFAULT 1,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
-- a live cluster's name is unique within its tenant; a deleted one frees it
CREATE UNIQUE INDEX clusters_tenant_name ON clusters (tenant_id, name) WHERE state NOT IN ('deleted', 'failed');
CREATE INDEX clusters_working ON clusters (state) WHERE state NOT IN ('ready', 'deleted', 'failed', 'queued');

CREATE TABLE members (
    allocation_id uuid PRIMARY KEY,
    cluster_id    uuid NOT NULL REFERENCES clusters (id),
    idx           int  NOT NULL,
    gang_id       uuid NOT NULL,
    state         text NOT NULL,
    node_id       uuid,
    attachment_id uuid,
    address       text,
    reason        text,
    UNIQUE (cluster_id, idx)
);
CREATE INDEX members_gang ON members (gang_id);

CREATE TABLE jobs (
    id            uuid PRIMARY KEY,
    tenant_id     uuid NOT NULL,
    user_id       uuid NOT NULL,
    cluster_id    uuid NOT NULL REFERENCES clusters (id),
    name          text NOT NULL,
    spec          jsonb NOT NULL,     -- the submit command as it arrived
    state         text NOT NULL,
    reason        text,
    exit_code     int,
    external_id   text,
    nodes         text[] NOT NULL DEFAULT '{}',
    version       bigint NOT NULL DEFAULT 1,
    submitted_at  timestamptz NOT NULL DEFAULT now(),
    started_at    timestamptz,
    ended_at      timestamptz
);
CREATE INDEX jobs_live ON jobs (cluster_id) WHERE state IN ('SUBMITTING', 'PENDING', 'RUNNING', 'CANCELLING');
