-- A power action's deadline (node_agent.power carries it; a node refuses the command after it), and when the
-- gateway gave up on an action no node answered by its deadline plus a grace (the sweep, entrypoints.loops):
-- such an action is failed with expired_at set, and a late answer of the node is still recorded
-- (adapters.instances.finish_action). Actions asked before deadlines existed get the default TTL (300 s), so
-- one left pending is swept too.
ALTER TABLE instance_actions
    ADD COLUMN IF NOT EXISTS expires_at timestamptz,
    ADD COLUMN IF NOT EXISTS expired_at timestamptz;
UPDATE instance_actions SET expires_at = requested_at + interval '300 seconds' WHERE expires_at IS NULL;
ALTER TABLE instance_actions ALTER COLUMN expires_at SET NOT NULL;
CREATE INDEX IF NOT EXISTS instance_actions_pending_by_deadline ON instance_actions (expires_at) WHERE state = 'pending';
