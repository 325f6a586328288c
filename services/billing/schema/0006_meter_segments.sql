-- An allocation may have several meters, one per stretch it ran: a reschedule stops its meter at the
-- interruption and starts a new one on the new node (usage has a hole in between). At most one runs.
ALTER TABLE meters DROP CONSTRAINT meters_allocation_id_key;
CREATE UNIQUE INDEX meters_running_allocation ON meters (allocation_id) WHERE stopped_at IS NULL;
CREATE INDEX meters_allocation ON meters (allocation_id, started_at);
