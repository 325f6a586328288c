-- Several release commands' changes in one round trip (adapters/claims.py ``withdraw_each``: a batch of releases).
-- Each is the ordinary ``withdraw`` (its locks in the claim's order, counting its node), in the order given, so a
-- repeated allocation is withdrawn once and found empty after; the answer is the array of their answers, in that
-- order.
CREATE FUNCTION withdraw_each(p_allocs uuid[]) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    a uuid;
    answers jsonb := '[]'::jsonb;
BEGIN
    FOREACH a IN ARRAY p_allocs LOOP
        answers := answers || jsonb_build_array(withdraw(a));
    END LOOP;
    RETURN answers;
END $$;
