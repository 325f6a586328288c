-- Several claims, all or none, in one round trip (adapters/claims.py ``claim_all``: a gang's members). Each is
-- the ordinary ``claim`` (its conditions, its locks in its order), made without counting; the first one refused
-- undoes the others (this function's block is a subtransaction) and its refusal is returned with the claim's
-- position ({"error": ..., "at": i}). Once all hold, the nodes are counted together, in node order, as the
-- transaction's last locks: {"capacity": {"<node id>": {"free_slots": n, "seq": s}, ...}}.
-- p_claims: [{"allocation_id", "tenant_id", "user_id", "node_id", "slots": [..], "shape", "gpu_model", "pool",
--             "units", "priority", "spot", "mig_profile", "mig_per_gpu"}, ...]
CREATE FUNCTION claim_all(p_claims jsonb) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    c jsonb;
    at int := 0;
    out jsonb;
    nodes uuid[] := '{}';
    why text;
BEGIN
    FOR c IN SELECT x FROM jsonb_array_elements(p_claims) AS x LOOP
        out := claim((c->>'allocation_id')::uuid, (c->>'tenant_id')::uuid, (c->>'user_id')::uuid,
                     (c->>'node_id')::uuid, ARRAY(SELECT jsonb_array_elements_text(c->'slots')::int),
                     c->>'shape', c->>'gpu_model', c->>'pool', (c->>'units')::int, (c->>'priority')::int,
                     (c->>'spot')::boolean, c->>'mig_profile', (c->>'mig_per_gpu')::int, false);
        IF out ? 'error' THEN
            RAISE EXCEPTION 'claims refused' USING DETAIL = (out || jsonb_build_object('at', at))::text;
        END IF;
        nodes := nodes || (c->>'node_id')::uuid;
        at := at + 1;
    END LOOP;
    RETURN jsonb_build_object('capacity', capacity_changed(nodes));
EXCEPTION WHEN raise_exception THEN
    GET STACKED DIAGNOSTICS why = PG_EXCEPTION_DETAIL;
    RETURN why::jsonb;
END $$;
