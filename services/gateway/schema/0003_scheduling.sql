-- Read models of the scheduler's inventory (nodes, shapes, pools, quotas), each projected from the
-- scheduler's whole-document *_changed events: a document is applied only when its version is newer.
-- ADD COLUMN IF NOT EXISTS: another migration of this schema may add the same column (network_id).

ALTER TABLE nodes_view DROP CONSTRAINT IF EXISTS nodes_view_status_check;
ALTER TABLE nodes_view ADD CONSTRAINT nodes_view_status_check
    CHECK (status IN ('registering', 'registered', 'pending_approval', 'schedulable', 'needs_review'));
ALTER TABLE nodes_view
    ADD COLUMN IF NOT EXISTS pool              text NOT NULL DEFAULT 'shared',
    ADD COLUMN IF NOT EXISTS region            text,
    ADD COLUMN IF NOT EXISTS site              text,
    ADD COLUMN IF NOT EXISTS rack              text,
    ADD COLUMN IF NOT EXISTS taints            jsonb NOT NULL DEFAULT '{}'::jsonb,
    ADD COLUMN IF NOT EXISTS cordoned          boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS proposal          int,
    ADD COLUMN IF NOT EXISTS proposed_slot_map jsonb,
    ADD COLUMN IF NOT EXISTS approved_slot_map jsonb,
    ADD COLUMN IF NOT EXISTS review            jsonb NOT NULL DEFAULT '[]'::jsonb,
    ADD COLUMN IF NOT EXISTS free_slots        int NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS version           int NOT NULL DEFAULT 0,   -- 0: no scheduler document yet
    ADD COLUMN IF NOT EXISTS last_rejection    jsonb,
    ADD COLUMN IF NOT EXISTS changed_at        timestamptz;
-- quota fast-fail: which GPU models a pool has
CREATE INDEX IF NOT EXISTS nodes_view_pool_model ON nodes_view (pool, gpu_model);

CREATE TABLE shapes_view (
    name           text PRIMARY KEY,
    kind           text NOT NULL,
    gpu_count      int  NOT NULL,
    gpu_model      text,
    mig_profile    text,
    deleted        boolean NOT NULL DEFAULT false,
    version        int  NOT NULL,
    last_rejection jsonb,
    changed_at     timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE pools_view (
    name           text PRIMARY KEY,
    policy         text NOT NULL,
    taints         jsonb NOT NULL DEFAULT '{}'::jsonb,
    description    text NOT NULL DEFAULT '',
    version        int  NOT NULL,
    last_rejection jsonb,
    changed_at     timestamptz NOT NULL DEFAULT now()
);

-- user_id = the nil uuid: the tenant's own quota; any other: a tenant admin's split for that user.
CREATE TABLE quotas_view (
    tenant_id   uuid NOT NULL,
    gpu_model   text NOT NULL,
    pool        text NOT NULL,
    user_id     uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000',
    "limit"     int  NOT NULL,
    guaranteed  int  NOT NULL DEFAULT 0,
    used        int  NOT NULL DEFAULT 0,
    version     int  NOT NULL,
    changed_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, gpu_model, pool, user_id)
);

-- Every inventory command the scheduler refused, so an admin can see why (newest last).
CREATE TABLE admin_rejections (
    event_id    uuid PRIMARY KEY,
    command     text NOT NULL,
    target      text NOT NULL,
    reason      text NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX admin_rejections_target ON admin_rejections (target, recorded_at);

-- Allocations: what the tenant asked about placement, the queue, preemption and a refusal's details.
ALTER TABLE allocations_view DROP CONSTRAINT IF EXISTS allocations_view_state_check;
ALTER TABLE allocations_view ADD CONSTRAINT allocations_view_state_check
    CHECK (state IN ('REQUESTED', 'QUEUED', 'PROVISIONING', 'ACTIVE', 'RELEASING', 'RELEASED', 'FAILED'));
ALTER TABLE allocations_view
    ADD COLUMN IF NOT EXISTS priority            int NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS spot                boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS pool                text,
    ADD COLUMN IF NOT EXISTS tolerations         jsonb NOT NULL DEFAULT '[]'::jsonb,
    ADD COLUMN IF NOT EXISTS fail_fast           boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS network_id          uuid,
    ADD COLUMN IF NOT EXISTS placed              boolean NOT NULL DEFAULT false,  -- slots reserved (after any queueing)
    ADD COLUMN IF NOT EXISTS queue_position      int,
    ADD COLUMN IF NOT EXISTS queued_reason       text,
    ADD COLUMN IF NOT EXISTS cancel_requested_at timestamptz,
    ADD COLUMN IF NOT EXISTS preemption          jsonb,
    ADD COLUMN IF NOT EXISTS problem             jsonb;
