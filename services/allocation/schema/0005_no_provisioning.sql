-- The allocate saga no longer tells an allocation it started: REQUESTED lasts until the saga activates it. A row
-- marked PROVISIONING before this version is REQUESTED in the same sense (its saga runs; activate moves it on).
UPDATE allocations SET state = 'REQUESTED' WHERE state = 'PROVISIONING';
ALTER TABLE allocations DROP CONSTRAINT allocations_state_check;
ALTER TABLE allocations ADD CONSTRAINT allocations_state_check
    CHECK (state IN ('REQUESTED', 'ACTIVE', 'INTERRUPTED', 'RELEASING', 'RELEASED', 'FAILED'));
