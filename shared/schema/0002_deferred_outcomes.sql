-- A participant may answer a step later (the scheduler queues a reservation that does not fit yet): the
-- step's outcome is 'deferred' until the final answer replaces it (shared.participant.defer / finish).
ALTER TABLE step_outcomes DROP CONSTRAINT step_outcomes_status_check;
ALTER TABLE step_outcomes ADD CONSTRAINT step_outcomes_status_check
    CHECK (status IN ('done', 'failed', 'compensated', 'deferred'));
