-- Gangs (domain/gang.py): N allocations reserved all or nothing. One row per gang id (the idempotency key): the
-- command as received, where it stands, and the answer a repeat gets. A waiting gang holds no slot: its members'
-- slots are claimed together, in one transaction, when it is placed (each under its member's allocation id).
CREATE TABLE gangs (
    gang_id        uuid PRIMARY KEY,
    tenant_id      uuid NOT NULL,
    request        jsonb NOT NULL,            -- the ReserveGang command as received
    correlation_id text NOT NULL,
    state          text NOT NULL CHECK (state IN ('queued', 'placed', 'rejected')),
    outcome        jsonb,                     -- placed: the gang_placed payload; rejected: the gang_rejected one
    enqueued_at    timestamptz NOT NULL DEFAULT now(),
    decided_at     timestamptz
);
CREATE INDEX gangs_waiting ON gangs (enqueued_at) WHERE state = 'queued';
