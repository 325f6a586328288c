-- When each step ran (the timeline of an allocation: saga.read_steps). started_at: when its command (or undo
-- command) was first sent, kept across resends (attempt counts them); finished_at: when it reached succeeded,
-- failed, timed_out or compensated, cleared when it is sent again. A skipped step starts and finishes at once.
-- Written by the statement that writes the record's status (adapters/repository.py: save).
ALTER TABLE saga_steps ADD COLUMN IF NOT EXISTS started_at timestamptz;
ALTER TABLE saga_steps ADD COLUMN IF NOT EXISTS finished_at timestamptz;
-- When the saga completed or failed (null while running or compensating).
ALTER TABLE sagas ADD COLUMN IF NOT EXISTS finished_at timestamptz;
