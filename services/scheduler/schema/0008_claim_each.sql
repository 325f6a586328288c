-- Several independent claims in one round trip (adapters/claims.py ``claim_each``: a batch of reservations
-- decided one after another). Each is the ordinary ``claim``, counting its node (its conditions, its locks in
-- its order, its own subtransaction: a refused one leaves nothing and the others stand), in the order given;
-- the answer is the array of their answers, in that order.
CREATE FUNCTION claim_each(p_claims jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    c jsonb;
    answers jsonb := '[]'::jsonb;
BEGIN
    FOR c IN SELECT x FROM jsonb_array_elements(p_claims) AS x LOOP
        answers := answers || jsonb_build_array(claim(
            (c->>'allocation_id')::uuid, (c->>'tenant_id')::uuid, (c->>'user_id')::uuid,
            (c->>'node_id')::uuid, ARRAY(SELECT jsonb_array_elements_text(c->'slots')::int),
            c->>'shape', c->>'gpu_model', c->>'pool', (c->>'units')::int, (c->>'priority')::int,
            (c->>'spot')::boolean, c->>'mig_profile', (c->>'mig_per_gpu')::int, true));
    END LOOP;
    RETURN answers;
END $$;
