-- One row per saga; at most one saga of each kind per allocation (starting is idempotent).
CREATE TABLE sagas (
    id            uuid PRIMARY KEY,
    kind          text NOT NULL CHECK (kind IN ('allocate', 'release')),
    allocation_id uuid NOT NULL,
    tenant_id     uuid NOT NULL,
    status        text NOT NULL CHECK (status IN ('running', 'compensating', 'completed', 'failed')),
    input         jsonb NOT NULL,
    current_step  text,
    failed_step   text,
    reason        text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (allocation_id, kind)
);
CREATE INDEX sagas_open ON sagas (updated_at) WHERE status IN ('running', 'compensating');

-- One row per (step, phase): the step itself ('invoke') and its undo ('compensate').
-- deadline is set while the row awaits a reply (or a backoff); the deadline loop claims passed ones.
CREATE TABLE saga_steps (
    saga_id  uuid NOT NULL REFERENCES sagas (id) ON DELETE CASCADE,
    step     text NOT NULL,
    phase    text NOT NULL CHECK (phase IN ('invoke', 'compensate')),
    status   text NOT NULL CHECK (status IN ('invoked', 'succeeded', 'failed', 'timed_out', 'retrying', 'armed',
                                             'disarmed', 'compensating', 'compensated')),
    attempt  int  NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    deadline timestamptz,
    result   jsonb,
    error    text,
    PRIMARY KEY (saga_id, step, phase)
);
CREATE INDEX saga_steps_due ON saga_steps (deadline) WHERE deadline IS NOT NULL;
