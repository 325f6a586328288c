-- Reschedule sagas: an allocation may be moved several times, one saga per move (its attempt number), so the
-- one-saga-per-kind rule becomes one per kind and attempt.
ALTER TABLE sagas DROP CONSTRAINT IF EXISTS sagas_kind_check;
ALTER TABLE sagas ADD CONSTRAINT sagas_kind_check CHECK (kind IN ('allocate', 'release', 'reschedule'));
ALTER TABLE sagas ADD COLUMN IF NOT EXISTS attempt int NOT NULL DEFAULT 0 CHECK (attempt >= 0);
ALTER TABLE sagas DROP CONSTRAINT IF EXISTS sagas_allocation_id_kind_key;
ALTER TABLE sagas ADD CONSTRAINT sagas_allocation_kind_attempt UNIQUE (allocation_id, kind, attempt);
