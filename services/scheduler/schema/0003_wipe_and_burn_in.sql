-- Quarantined slots and burn-in.
--
-- A slot whose wipe failed is quarantined: quarantine_reason says why. It is taken out of service the way
-- the schema already knows, an empty wipe_policy (never claimed, never counted free), so the claim and
-- the count need no change; the approved map's policy stays in ``detail`` and comes back when a provider
-- admin's re-wipe succeeds (claims.return_slot). Installing a newer approved map keeps a quarantine.
ALTER TABLE slots ADD COLUMN quarantine_reason text, ADD COLUMN quarantined_at timestamptz;

-- burn_in: a newly approved node (or one re-run by a provider admin) is burnt in before it is schedulable;
-- burn_in_failed keeps it out of service with the failed checks named in ``review``.
ALTER TABLE nodes DROP CONSTRAINT nodes_status_check;
ALTER TABLE nodes ADD CONSTRAINT nodes_status_check
    CHECK (status IN ('registered', 'pending_approval', 'burn_in', 'burn_in_failed', 'schedulable', 'needs_review'));
ALTER TABLE nodes ADD COLUMN burn_in jsonb;   -- the last run: {run_id, state, checks, requested_by, started_at, finished_at}
