-- Issue 13: tenant volumes in storage classes, their attachments to allocations, quotas per (tenant, class).
-- The volumes of 0001 were rows only (nothing existed on any storage system; development data): dropped.
DROP TABLE volumes;
DROP TABLE tenant_quotas;

CREATE TABLE volumes (
    id             uuid PRIMARY KEY,
    tenant_id      uuid   NOT NULL,
    user_id        uuid,
    name           text   NOT NULL,
    storage_class  text   NOT NULL,
    backend        text   NOT NULL,                      -- '' for a create refused for an unknown class
    size_bytes     bigint NOT NULL CHECK (size_bytes >= 0),
    used_bytes     bigint CHECK (used_bytes >= 0),
    shared         boolean NOT NULL DEFAULT false,
    scratch        boolean NOT NULL DEFAULT false,
    allocation_id  uuid,                                 -- a scratch volume's allocation
    state          text   NOT NULL CHECK (state IN ('creating', 'available', 'in-use', 'deleting', 'deleted',
                                                    'rejected', 'error')),
    reason         text,
    export_source  text,
    export_options jsonb  NOT NULL DEFAULT '{}',
    version        bigint NOT NULL CHECK (version >= 1),
    created_at     timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL,
    CHECK (scratch = (allocation_id IS NOT NULL))
);
-- A live volume's name is unique in its tenant (a tombstone's or a refused create's name is free again).
CREATE UNIQUE INDEX volumes_live_name ON volumes (tenant_id, name) WHERE state NOT IN ('deleted', 'rejected');
-- At most one live scratch volume per allocation.
CREATE UNIQUE INDEX volumes_scratch ON volumes (allocation_id) WHERE scratch AND state NOT IN ('deleted', 'rejected');
CREATE INDEX volumes_by_class ON volumes (tenant_id, storage_class) WHERE state NOT IN ('deleted', 'rejected');

CREATE TABLE attachments (
    volume_id     uuid NOT NULL REFERENCES volumes (id),
    allocation_id uuid NOT NULL,
    mode          text NOT NULL CHECK (mode IN ('rw', 'ro')),
    node_id       uuid,
    state         text NOT NULL CHECK (state IN ('attaching', 'attached', 'detaching', 'failed')),
    reason        text,
    client        text,                                  -- the slot's address the backend lets in
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (volume_id, allocation_id)
);
CREATE INDEX attachments_by_allocation ON attachments (allocation_id);

-- A tenant's limits in a class; NULL: the service's default. The row is also the lock that makes "sum the
-- use, then add or grow a volume" one decision (created on first use, locked FOR UPDATE).
CREATE TABLE quotas (
    tenant_id     uuid   NOT NULL,
    storage_class text   NOT NULL,
    max_bytes     bigint CHECK (max_bytes >= 0),
    max_volumes   int    CHECK (max_volumes >= 0),
    version       bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, storage_class)
);

-- A user's share of its tenant's quota in a class (a tenant admin's split); NULL: no limit of its own.
CREATE TABLE user_quotas (
    tenant_id     uuid   NOT NULL,
    storage_class text   NOT NULL,
    user_id       uuid   NOT NULL,
    max_bytes     bigint CHECK (max_bytes >= 0),
    max_volumes   int    CHECK (max_volumes >= 0),
    version       bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, storage_class, user_id)
);
