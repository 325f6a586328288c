-- Tenant volumes, as the gateway requests and shows them: projected from storage.* events.

-- One row per volume: written 'creating' (version 0) by POST /v1/volumes, then replaced by each newer
-- storage.volume_changed document (the highest version wins). pending_size_bytes: a resize the gateway asked
-- for and no newer document has answered yet (counted against the quota meanwhile); attachments: the
-- document's list ([{allocation_id, mode, node_id, state, reason}]), with the gateway's own 'attaching' or
-- 'detaching' mark until the next document. Names are unique among a tenant's live volumes: the POST checks
-- under a per-tenant lock (the projection never refuses a document).
CREATE TABLE IF NOT EXISTS volumes_view (
    id                 uuid PRIMARY KEY,
    tenant_id          uuid NOT NULL,
    user_id            uuid,
    name               text NOT NULL,
    storage_class      text NOT NULL,
    backend            text,
    size_bytes         bigint NOT NULL,
    pending_size_bytes bigint,
    used_bytes         bigint,
    usage_at           timestamptz,
    shared             boolean NOT NULL DEFAULT false,
    scratch            boolean NOT NULL DEFAULT false,
    state              text NOT NULL CHECK (state IN ('creating', 'available', 'in-use', 'deleting', 'deleted',
                                                      'rejected', 'error')),
    reason             text,
    attachments        jsonb NOT NULL DEFAULT '[]'::jsonb,
    version            int NOT NULL DEFAULT 0,            -- 0: requested here, no document yet
    created_at         timestamptz NOT NULL DEFAULT now(),
    updated_at         timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS volumes_view_by_tenant ON volumes_view (tenant_id, created_at DESC, id DESC);
CREATE INDEX IF NOT EXISTS volumes_view_live ON volumes_view (tenant_id, storage_class, user_id)
    WHERE state IN ('creating', 'available', 'in-use', 'deleting');

-- A tenant's quota in one storage class (user_id nil) and its users' shares, from storage.quota_changed.
-- A row at version 0 is a placeholder a POST or PATCH inserted to lock (SELECT ... FOR UPDATE) while it
-- counts the class's volumes: nothing is set there.
CREATE TABLE IF NOT EXISTS volume_quotas_view (
    tenant_id             uuid NOT NULL,
    storage_class         text NOT NULL,
    user_id               uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000',
    max_bytes             bigint,
    max_volumes           int,
    effective_max_bytes   bigint,
    effective_max_volumes int,
    version               int NOT NULL DEFAULT 0,
    changed_at            timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, storage_class, user_id)
);

-- The storage classes the provider offers, as last announced (storage.classes_announced): one row.
CREATE TABLE IF NOT EXISTS storage_classes_view (
    id                    int PRIMARY KEY CHECK (id = 1),
    classes               jsonb NOT NULL,
    default_quota_bytes   bigint NOT NULL,
    default_quota_volumes int NOT NULL,
    announced_at          timestamptz NOT NULL
);

-- What an allocation asked to mount (VolumeRef: [{volume_id, mode}]) and the class of its scratch volume.
ALTER TABLE allocations_view
    ADD COLUMN IF NOT EXISTS volumes       jsonb NOT NULL DEFAULT '[]'::jsonb,
    ADD COLUMN IF NOT EXISTS scratch_class text;
CREATE INDEX IF NOT EXISTS allocations_view_volumes ON allocations_view USING gin (volumes jsonb_path_ops);
