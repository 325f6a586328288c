-- A node's free slots in the order they changed, and the guard that keeps a shape in use from being deleted.

-- One row per node whose slots were ever installed, taken or freed. ``seq`` is raised by one in the
-- transaction of every claim, release and slot-map install on the node, after its slot rows changed; the
-- node's free slots are counted in a later statement of that transaction (``capacity_changed``). The row
-- lock serialises those transactions per node from the raise to the commit, so seq order is commit order
-- and each (free slots, seq) pair is the node's state after exactly the changes up to seq: a read model
-- keeps the pair with the highest seq, whatever order it receives them in. A snapshot that reads the pair
-- in one statement (the node document) reads a consistent one too.
-- A table of its own, not a column of nodes: admin handlers hold the node row for their whole transaction
-- and place queued requests in it (taking quota rows), so a claim waiting on the node row would deadlock
-- with them. No foreign key either (nodes are never deleted): its check would lock the node row too.
CREATE TABLE node_capacity (
    node_id uuid PRIMARY KEY,
    seq     bigint NOT NULL DEFAULT 0
);
INSERT INTO node_capacity (node_id) SELECT id FROM nodes;

-- Free: no allocation holds the slot, whole (no MIG instance on it), with a wipe policy, not retired; what
-- a whole-GPU shape could take. Whatever the node's status (the node document shows 0 unless schedulable).
CREATE FUNCTION node_free_slots(p_node uuid) RETURNS int LANGUAGE sql STABLE AS $$
    SELECT count(*)::int FROM slots
     WHERE node_id = p_node AND allocation_id IS NULL AND mig_used = 0 AND wipe_policy <> '' AND NOT retired
$$;

-- Raise the capacity sequence of each node (in node id order: transactions that touch several nodes never
-- deadlock on these rows), then count their free slots. Call it after the slot rows changed, as the last
-- lock the transaction takes. Returns {"<node id>": {"free_slots": n, "seq": s}, ...}.
CREATE FUNCTION capacity_changed(p_nodes uuid[]) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    n uuid;
    counted jsonb;
BEGIN
    FOR n IN SELECT DISTINCT x FROM unnest(p_nodes) AS x ORDER BY x LOOP
        INSERT INTO node_capacity AS c (node_id, seq) VALUES (n, 1)
        ON CONFLICT (node_id) DO UPDATE SET seq = c.seq + 1;
    END LOOP;
    -- a statement of its own: its snapshot sees every change that committed while this waited for a row above
    SELECT coalesce(jsonb_object_agg(c.node_id, jsonb_build_object('free_slots', node_free_slots(c.node_id),
                                                                   'seq', c.seq)), '{}'::jsonb)
      INTO counted FROM node_capacity c WHERE c.node_id = ANY(p_nodes);
    RETURN counted;
END $$;

-- The release path's slot half (adapters/claims.py): free what the allocation holds, then count.
CREATE FUNCTION free_held(p_alloc uuid, p_node uuid, p_slots int[], p_mig boolean) RETURNS jsonb LANGUAGE plpgsql AS $$
BEGIN
    IF p_mig THEN
        UPDATE slots SET mig_used = mig_used - 1, mig_profile = CASE WHEN mig_used = 1 THEN NULL ELSE mig_profile END
         WHERE node_id = p_node AND idx = ANY(p_slots);
    ELSE
        UPDATE slots SET allocation_id = NULL, reserved_at = NULL WHERE allocation_id = p_alloc;
    END IF;
    RETURN capacity_changed(ARRAY[p_node]) -> p_node::text;
END $$;

-- The shape guard for a request that waits in the queue (claims.hold_shape): hold the shape's lock (shared) as a
-- claim does; false when the shape is deleted. Two statements: the second sees a deletion it waited for.
CREATE FUNCTION hold_shape(p_shape text) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtextextended('scheduler.shape:' || p_shape, 0));
    RETURN EXISTS (SELECT 1 FROM shapes WHERE name = p_shape AND NOT deleted);
END $$;

-- The claim of 0001 with two additions (the 13-argument one stays for a replica still running the previous
-- release; a later migration drops it):
-- - the shape guard: a claim holds its shape's advisory lock (shared) until it commits, and refuses a shape
--   that is deleted ({"error": "shape"}); deleting a shape takes that lock exclusively (claims.shape_users),
--   so the deletion sees every claim of the shape that got this far, and a claim that waited sees the deletion;
-- - p_count: raise the node's capacity sequence and count its free slots ({"capacity": {...}}). A transaction
--   that claims several times passes false and calls capacity_changed once at the end, for all the nodes.
CREATE FUNCTION claim(p_alloc uuid, p_tenant uuid, p_user uuid, p_node uuid, p_slots int[], p_shape text,
                      p_model text, p_pool text, p_units int, p_priority int, p_spot boolean, p_mig text,
                      p_mig_per_gpu int, p_count boolean) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    nil constant uuid := '00000000-0000-0000-0000-000000000000';
    who uuid;
    q record;
    details jsonb;
    why text;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtextextended('scheduler.shape:' || p_shape, 0));
    IF NOT EXISTS (SELECT 1 FROM shapes WHERE name = p_shape AND NOT deleted) THEN
        RAISE EXCEPTION 'claim refused' USING DETAIL = '{"error": "shape"}';
    END IF;
    FOREACH who IN ARRAY CASE WHEN p_user IS NULL THEN ARRAY[nil] ELSE ARRAY[nil, p_user] END LOOP
        UPDATE quotas SET used = used + p_units, version = version + 1
         WHERE tenant_id = p_tenant AND gpu_model = p_model AND pool = p_pool AND user_id = who
           AND used + p_units <= "limit";
        IF NOT FOUND THEN
            SELECT "limit", used INTO q FROM quotas
             WHERE tenant_id = p_tenant AND gpu_model = p_model AND pool = p_pool AND user_id = who;
            IF FOUND OR who = nil THEN
                RAISE EXCEPTION 'claim refused' USING DETAIL = jsonb_build_object(
                    'error', 'quota', 'user', CASE WHEN who = nil THEN NULL ELSE who END,
                    'limit', q."limit", 'used', coalesce(q.used, 0))::text;
            END IF;
        END IF;
    END LOOP;
    IF p_mig IS NULL THEN
        WITH t AS (UPDATE slots SET allocation_id = p_alloc, reserved_at = now()
                    WHERE node_id = p_node AND idx = ANY(p_slots) AND allocation_id IS NULL AND mig_used = 0
                      AND wipe_policy <> '' AND NOT retired RETURNING idx, detail)
        SELECT jsonb_agg(detail ORDER BY idx) INTO details FROM t;
    ELSE
        WITH t AS (UPDATE slots SET mig_profile = p_mig, mig_used = mig_used + 1
                    WHERE node_id = p_node AND idx = ANY(p_slots) AND allocation_id IS NULL
                      AND (mig_profile IS NULL OR mig_profile = p_mig) AND mig_used < p_mig_per_gpu
                      AND wipe_policy <> '' AND NOT retired RETURNING idx, detail)
        SELECT jsonb_agg(detail ORDER BY idx) INTO details FROM t;
    END IF;
    IF coalesce(jsonb_array_length(details), 0) <> cardinality(p_slots)
       OR NOT EXISTS (SELECT 1 FROM nodes WHERE id = p_node AND status = 'schedulable' AND NOT cordoned) THEN
        RAISE EXCEPTION 'claim refused' USING DETAIL = '{"error": "taken"}';
    END IF;
    INSERT INTO allocations (allocation_id, tenant_id, user_id, node_id, slots, shape, gpu_model, pool, gpus,
                             priority, spot, mig_profile)
    VALUES (p_alloc, p_tenant, p_user, p_node, p_slots, p_shape, p_model, p_pool, p_units, p_priority, p_spot, p_mig);
    IF p_count THEN
        RETURN jsonb_build_object('details', details, 'capacity', capacity_changed(ARRAY[p_node]) -> p_node::text);
    END IF;
    RETURN jsonb_build_object('details', details);
EXCEPTION WHEN raise_exception THEN
    GET STACKED DIAGNOSTICS why = PG_EXCEPTION_DETAIL;
    RETURN why::jsonb;
END $$;
