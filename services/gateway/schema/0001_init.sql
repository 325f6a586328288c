-- Identity: tenants, users (tenant_id NULL only for provider admins), API keys (only a hash is stored).
CREATE TABLE tenants (
    id          uuid PRIMARY KEY,
    name        text NOT NULL UNIQUE,
    created_by  uuid,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE users (
    id          uuid PRIMARY KEY,
    tenant_id   uuid REFERENCES tenants (id),
    name        text NOT NULL,
    role        text NOT NULL CHECK (role IN ('provider_admin', 'tenant_admin', 'tenant_user')),
    created_by  uuid,
    created_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((role = 'provider_admin') = (tenant_id IS NULL))
);
CREATE UNIQUE INDEX users_name_per_tenant ON users (tenant_id, name) WHERE tenant_id IS NOT NULL;
CREATE UNIQUE INDEX users_provider_admin_name ON users (name) WHERE tenant_id IS NULL;

CREATE TABLE api_keys (
    key_hash    text PRIMARY KEY,          -- sha256 hex of the key; the key itself is never stored
    user_id     uuid NOT NULL REFERENCES users (id),
    bootstrap   boolean NOT NULL DEFAULT false,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);
CREATE INDEX api_keys_user ON api_keys (user_id);

-- Idempotency-Key of POST /v1/allocations: the primary key serialises concurrent requests with one key.
CREATE TABLE idempotency_keys (
    tenant_id     uuid NOT NULL,
    key           text NOT NULL,
    request_hash  text NOT NULL,
    allocation_id uuid NOT NULL,
    response      jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, key)
);
CREATE INDEX idempotency_keys_age ON idempotency_keys (created_at);

-- Read model of allocations, projected from allocation.* events (state only moves forward).
CREATE TABLE allocations_view (
    id                    uuid PRIMARY KEY,
    tenant_id             uuid NOT NULL,
    user_id               uuid NOT NULL,
    name                  text NOT NULL,
    shape                 text NOT NULL,
    gpu_count             int  NOT NULL CHECK (gpu_count > 0),
    volume_gb             int  NOT NULL CHECK (volume_gb >= 0),
    labels                jsonb NOT NULL DEFAULT '{}'::jsonb,
    state                 text NOT NULL CHECK (state IN ('REQUESTED', 'PROVISIONING', 'ACTIVE', 'RELEASING', 'RELEASED', 'FAILED')),
    node_id               uuid,
    failed_step           text,
    reason                text,
    release_requested_at  timestamptz,
    created_at            timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL DEFAULT now()
);
-- keyset pagination, newest first, per tenant
CREATE INDEX allocations_view_page ON allocations_view (tenant_id, created_at DESC, id DESC);

-- Every event about an allocation, in arrival order, for GET /v1/allocations/{id}/events.
CREATE TABLE allocation_events (
    seq           bigserial PRIMARY KEY,
    event_id      uuid NOT NULL UNIQUE,
    allocation_id uuid NOT NULL,
    type          text NOT NULL,
    envelope      jsonb NOT NULL,
    recorded_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX allocation_events_by_allocation ON allocation_events (allocation_id, seq);

-- Nodes as requested through the API, and as the scheduler confirmed them.
CREATE TABLE nodes_view (
    id            uuid PRIMARY KEY,
    name          text NOT NULL UNIQUE,
    gpu_model     text NOT NULL,
    gpu_count     int  NOT NULL CHECK (gpu_count > 0),
    labels        jsonb NOT NULL DEFAULT '{}'::jsonb,
    status        text NOT NULL CHECK (status IN ('registering', 'registered')),
    requested_by  uuid,
    requested_at  timestamptz,
    registered_at timestamptz
);
