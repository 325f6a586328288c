-- INTERRUPTED: the allocation lost its node and a reschedule saga places it again (same id). The row keeps the
-- last interruption (when the tenant lost it, its category) and how many reschedules it started, all told (the
-- retry policy's count); node_id stays the node it lost until it is ACTIVE again.
ALTER TABLE allocations DROP CONSTRAINT allocations_state_check;
ALTER TABLE allocations ADD CONSTRAINT allocations_state_check
    CHECK (state IN ('REQUESTED', 'PROVISIONING', 'ACTIVE', 'INTERRUPTED', 'RELEASING', 'RELEASED', 'FAILED'));
ALTER TABLE allocations
    ADD COLUMN interrupted_at     timestamptz,
    ADD COLUMN interrupt_category text CHECK (interrupt_category IN ('node_lost', 'gpu_fault', 'drain', 'maintenance')),
    ADD COLUMN reschedules        int NOT NULL DEFAULT 0 CHECK (reschedules >= 0),
    ADD CONSTRAINT allocations_interrupted_check
        CHECK (state <> 'INTERRUPTED' OR (node_id IS NOT NULL AND interrupted_at IS NOT NULL));
