-- Allocations interrupted by a failed node, as the gateway shows them to their tenants.

-- An allocation whose node failed waits, INTERRUPTED, to be rescheduled; interruption is its last one
-- ({category, reason, node_id, interrupted_at, next, attempt, rescheduled} and, once ACTIVE again on another node,
-- {from_node_id, to_node_id, gap_s} too).
ALTER TABLE allocations_view DROP CONSTRAINT IF EXISTS allocations_view_state_check;
ALTER TABLE allocations_view ADD CONSTRAINT allocations_view_state_check
    CHECK (state IN ('REQUESTED', 'QUEUED', 'PROVISIONING', 'ACTIVE', 'INTERRUPTED', 'RELEASING', 'RELEASED',
                     'FAILED'));
ALTER TABLE allocations_view ADD COLUMN IF NOT EXISTS interruption jsonb;
