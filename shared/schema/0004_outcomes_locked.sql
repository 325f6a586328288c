-- A batch of a participant's step commands locks all their idempotency keys and reads their recorded outcomes
-- in one round trip (shared.batches, before the handlers run). The keys are locked in one order (sorted), so
-- two batches sharing keys cannot deadlock on them; the read, a statement of its own, takes its snapshot after
-- the last lock is granted (see step_outcome_locked, 0003).
CREATE FUNCTION step_outcomes_locked(keys text[]) RETURNS TABLE (key text, status text, result jsonb)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    k text;
BEGIN
    FOR k IN SELECT DISTINCT x FROM unnest(keys) AS x ORDER BY x LOOP
        PERFORM pg_advisory_xact_lock(hashtextextended(k, 0));
    END LOOP;
    RETURN QUERY SELECT o.idempotency_key, o.status, o.result FROM step_outcomes o
                 WHERE o.idempotency_key = ANY(keys) ORDER BY o.idempotency_key FOR UPDATE;
END
$$;
