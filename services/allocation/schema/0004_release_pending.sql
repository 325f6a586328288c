-- A release asked while the allocation is INTERRUPTED waits for its reschedule: done as soon as it is ACTIVE again
-- (a reschedule that fails leaves it FAILED, holding nothing).
ALTER TABLE allocations
    ADD COLUMN release_pending    boolean NOT NULL DEFAULT false,
    ADD COLUMN release_pending_by uuid;
