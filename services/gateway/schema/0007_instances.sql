-- What runs for an allocation: the image it boots (the name of the snapshot sent with allocation.request), the
-- instance allocation.activated described (node_agent.contracts.InstanceInfo as JSON; its power_state follows
-- node_agent.power_changed, applied only when newer than power_changed_at).
ALTER TABLE allocations_view
    ADD COLUMN IF NOT EXISTS image            text,
    ADD COLUMN IF NOT EXISTS instance         jsonb,
    ADD COLUMN IF NOT EXISTS power_changed_at timestamptz;

-- A tenant's power actions on its instances, and their outcome (node_agent.power_changed). The audit record
-- of these privileged mutations for now: who asked what of which allocation on which node, and when.
CREATE TABLE IF NOT EXISTS instance_actions (
    id            uuid PRIMARY KEY,
    allocation_id uuid NOT NULL,
    tenant_id     uuid NOT NULL,
    user_id       uuid NOT NULL,
    node_id       uuid NOT NULL,
    action        text NOT NULL CHECK (action IN ('reboot', 'stop', 'start')),
    state         text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'succeeded', 'failed')),
    reason        text,
    power_state   text,
    requested_at  timestamptz NOT NULL DEFAULT now(),
    finished_at   timestamptz
);
CREATE INDEX IF NOT EXISTS instance_actions_by_allocation ON instance_actions (allocation_id, requested_at DESC, id DESC);
