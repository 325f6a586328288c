-- The release path in one round trip (adapters/claims.py ``release``, ``withdraw``): what took three statements (delete the
-- allocation, refund its quota rows, free its slots and count the node) is one function. The locks are taken in
-- the same order as before, the claim's: the allocation row, the quota rows (tenant's, then the user's split),
-- the slot rows, the node's capacity row last. Returns NULL when the allocation held nothing, else
-- {"held": <the deleted allocations row>, "capacity": {"free_slots": n, "seq": s}}.
CREATE FUNCTION release_held(p_alloc uuid) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    nil constant uuid := '00000000-0000-0000-0000-000000000000';
    a allocations;
BEGIN
    DELETE FROM allocations WHERE allocation_id = p_alloc RETURNING * INTO a;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    UPDATE quotas SET used = greatest(used - a.gpus, 0), version = version + 1
     WHERE tenant_id = a.tenant_id AND gpu_model = a.gpu_model AND pool = a.pool
       AND user_id = ANY(CASE WHEN a.user_id IS NULL THEN ARRAY[nil] ELSE ARRAY[nil, a.user_id] END);
    RETURN jsonb_build_object('held', to_jsonb(a),
                              'capacity', free_held(p_alloc, a.node_id, a.slots, a.mig_profile IS NOT NULL));
END $$;

-- A release command's whole change in one round trip (adapters/claims.py ``withdraw``): the holding released as
-- above, then the request taken out of the queue should it wait there:
-- {"held": <row> or null, "capacity": {...} or null, "queued": <the pending row> or null}.
CREATE FUNCTION withdraw(p_alloc uuid) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    released jsonb := release_held(p_alloc);
    q pending;
BEGIN
    DELETE FROM pending WHERE allocation_id = p_alloc RETURNING * INTO q;
    RETURN coalesce(released, '{"held": null, "capacity": null}'::jsonb)
           || jsonb_build_object('queued', CASE WHEN FOUND THEN to_jsonb(q) END);
END $$;
