-- A participant locks a step's idempotency key and reads its recorded outcome in one round trip
-- (shared.participant.recorded). A function, not one statement: a statement's snapshot is taken before its
-- lock is granted, so it could miss the outcome the previous holder committed; each statement of a
-- volatile function takes a fresh snapshot, so the read here sees it.
CREATE FUNCTION step_outcome_locked(key text) RETURNS TABLE (status text, result jsonb)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(key, 0));
    RETURN QUERY SELECT o.status, o.result FROM step_outcomes o WHERE o.idempotency_key = key FOR UPDATE;
END
$$;
