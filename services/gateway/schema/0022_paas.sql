-- Tenant clusters and their jobs, as the gateway requests and shows them: projected from paas.* events.

-- One row per cluster: written 'placing' (version 0) by POST /v1/clusters, then replaced by each newer
-- paas.cluster_changed document (the highest version wins). pending_node_count: a scale the gateway asked for
-- and no newer document has answered yet; nodes: the document's [{name, allocation_id, state, address}].
CREATE TABLE IF NOT EXISTS clusters_view (
    id                 uuid PRIMARY KEY,
    tenant_id          uuid NOT NULL,
    user_id            uuid,
    name               text NOT NULL,
    kind               text NOT NULL,
    shape              text NOT NULL,
    gpu_count          int NOT NULL,
    node_count         int NOT NULL,
    pending_node_count int,
    network_id         uuid,
    pool               text,
    priority           int NOT NULL DEFAULT 0,
    state              text NOT NULL,
    reason             text,
    driver             text,
    controller         text,
    nodes              jsonb NOT NULL DEFAULT '[]'::jsonb,
    autoscaling        jsonb,
    spot               boolean NOT NULL DEFAULT false,
    version            int NOT NULL DEFAULT 0,            -- 0: requested here, no document yet
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS clusters_view_by_tenant ON clusters_view (tenant_id, created_at DESC, id DESC);
-- names are unique among a tenant's live clusters: the POST checks under a per-tenant lock
CREATE INDEX IF NOT EXISTS clusters_view_live_name ON clusters_view (tenant_id, name)
    WHERE state NOT IN ('deleted', 'failed');

-- One row per job: written 'SUBMITTING' (version 0) by POST /v1/jobs, then replaced by each newer
-- paas.job_changed document.
CREATE TABLE IF NOT EXISTS jobs_view (
    id            uuid PRIMARY KEY,
    tenant_id     uuid NOT NULL,
    user_id       uuid,
    cluster_id    uuid NOT NULL,
    name          text NOT NULL,
    state         text NOT NULL,
    reason        text,
    exit_code     int,
    external_id   text,
    tasks         int NOT NULL,
    gpus_per_task int NOT NULL,
    time_limit_s  int NOT NULL,
    nodes         jsonb NOT NULL DEFAULT '[]'::jsonb,
    cancel_requested_at timestamptz,
    version       int NOT NULL DEFAULT 0,
    created_at    timestamptz NOT NULL DEFAULT now(),   -- when it was submitted
    started_at    timestamptz,
    ended_at      timestamptz,
    updated_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS jobs_view_by_tenant ON jobs_view (tenant_id, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS jobs_view_by_cluster ON jobs_view (tenant_id, cluster_id, created_at DESC, id DESC);

-- Idempotency-Key of POST /v1/clusters (as idempotency_keys is POST /v1/allocations').
CREATE TABLE IF NOT EXISTS cluster_idempotency_keys (
    tenant_id    uuid NOT NULL,
    key          text NOT NULL,
    request_hash text NOT NULL,
    cluster_id   uuid NOT NULL,
    response     jsonb NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, key)
);
CREATE INDEX IF NOT EXISTS cluster_idempotency_keys_age ON cluster_idempotency_keys (created_at);
