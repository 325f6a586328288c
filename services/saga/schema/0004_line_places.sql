-- What each waiting request was last told of its place in its tenant's line (saga.allocation_waiting;
-- services/saga/domain/lines.py: retell). Null: not told yet.
ALTER TABLE saga_waiting ADD COLUMN told_place integer;

-- Lines that moved without their tenant's lock (an ending saga handed its place over): the deadline loop
-- tells their waiting requests their new places, under the tenant's lock. Insert-only (no key to wait on),
-- so an ending saga never waits here.
CREATE TABLE saga_line_moves (
    id        bigserial PRIMARY KEY,
    tenant_id uuid NOT NULL
);

-- A tenant's release of an allocation before its allocate saga started (saga.withdraw):
--   withdrawn   left its line (or never joined it): released, its release saga skips every step but the last;
--   early       asked before its request reached the coordinator: withdrawn when the request comes;
--   after_start its allocate saga was running: released once that saga completes (the row goes when it ends).
-- A withdrawn row stays: a repeated request for the allocation neither starts it nor puts it in line.
CREATE TABLE saga_withdrawals (
    allocation_id uuid PRIMARY KEY,
    tenant_id     uuid NOT NULL,
    requested_by  uuid NOT NULL,
    state         text NOT NULL CHECK (state IN ('withdrawn', 'early', 'after_start')),
    at            timestamptz NOT NULL DEFAULT now()
);
