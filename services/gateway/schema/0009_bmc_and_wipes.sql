-- Bare metal, wipe-on-release and burn-in, as the gateway keeps and shows them.

-- The node document: the scheduler's new statuses, its quarantined slots ([{slot, reason, since}]) and its last
-- burn-in run ({run_id, state, checks, requested_by, started_at, finished_at} or NULL), from scheduler.node_changed.
ALTER TABLE nodes_view DROP CONSTRAINT IF EXISTS nodes_view_status_check;
ALTER TABLE nodes_view ADD CONSTRAINT nodes_view_status_check
    CHECK (status IN ('registering', 'registered', 'pending_approval', 'burn_in', 'burn_in_failed', 'schedulable',
                      'needs_review', 'rejected'));
ALTER TABLE nodes_view
    ADD COLUMN IF NOT EXISTS quarantined jsonb NOT NULL DEFAULT '[]'::jsonb,
    ADD COLUMN IF NOT EXISTS burn_in     jsonb;

-- Each node's BMC as a provider admin registered it (PUT /v1/nodes/{id}/bmc). The password is kept only sealed
-- (AES-GCM with the platform's key, purpose 'bmc:<node id>': shared.secrets), never in clear. A removed BMC
-- keeps its row with the BMC columns NULL: the version only ever grows, so the node-agent (which keeps the
-- highest version of node_agent.set_bmc) never takes an older registration for a newer one.
CREATE TABLE IF NOT EXISTS node_bmcs (
    node_id         uuid PRIMARY KEY,
    url             text,
    system_id       text,
    username        text,
    password_sealed text,
    verify_tls      boolean,
    ca_bundle       text,
    version         int  NOT NULL CHECK (version >= 1),
    set_by          uuid NOT NULL,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CHECK ((url IS NULL) = (password_sealed IS NULL) AND (url IS NULL) = (system_id IS NULL)
           AND (url IS NULL) = (username IS NULL) AND (url IS NULL) = (verify_tls IS NULL))
);

-- A release's wipe as the node-agent answered it (node_agent.slots_wiped): one row per allocation, even when
-- it listed no slot, so GET /v1/allocations/{id}/wipe can tell "wiping" from "wiped".
CREATE TABLE IF NOT EXISTS allocation_wipes (
    allocation_id uuid PRIMARY KEY,
    node_id       uuid NOT NULL,
    event_id      uuid NOT NULL,
    quarantine    jsonb NOT NULL DEFAULT '[]'::jsonb,   -- [{slot, reason}] as the node-agent listed them
    recorded_at   timestamptz NOT NULL DEFAULT now()
);

-- The evidence of every slot wipe: a release's (allocation_id set, request_id NULL) and a provider admin's
-- re-wipe of a quarantined slot (node_agent.slot_rewiped: request_id set; allocation_id set to the allocation
-- whose release left the slot quarantined, when the gateway holds that release's evidence). ok: the wipe
-- passed and the slot was not quarantined. evidence: node_agent's SlotWipe as JSON.
CREATE TABLE IF NOT EXISTS slot_wipes (
    id            bigserial PRIMARY KEY,
    node_id       uuid NOT NULL,
    slot          int  NOT NULL CHECK (slot >= 0),
    allocation_id uuid,
    request_id    uuid,
    requested_by  uuid,
    ok            boolean NOT NULL,
    reason        text,
    evidence      jsonb NOT NULL,
    event_id      uuid NOT NULL,
    recorded_at   timestamptz NOT NULL DEFAULT now(),
    CHECK (request_id IS NOT NULL OR allocation_id IS NOT NULL)
);
CREATE UNIQUE INDEX IF NOT EXISTS slot_wipes_release ON slot_wipes (allocation_id, slot) WHERE request_id IS NULL;
CREATE UNIQUE INDEX IF NOT EXISTS slot_wipes_rewipe ON slot_wipes (request_id) WHERE request_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS slot_wipes_by_allocation ON slot_wipes (allocation_id, slot, id) WHERE allocation_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS slot_wipes_by_slot ON slot_wipes (node_id, slot, id);
