-- The scheduler's schema. PostgreSQL is the source of truth; the service keeps an in-memory index of it
-- for fast decisions. Every claim below is conditional in SQL (a slot only WHERE allocation_id IS NULL,
-- a quota only WHERE used + n <= limit), so the database alone forbids double booking and overrun.

CREATE TABLE pools (
    name        text PRIMARY KEY,
    policy      text NOT NULL DEFAULT 'pack' CHECK (policy IN ('pack', 'spread')),
    taints      jsonb NOT NULL DEFAULT '{}'::jsonb,
    description text NOT NULL DEFAULT '',
    version     int  NOT NULL DEFAULT 1
);
INSERT INTO pools (name, policy, description) VALUES ('shared', 'pack', 'Default shared pool');

CREATE TABLE shapes (
    name        text PRIMARY KEY,
    kind        text NOT NULL CHECK (kind IN ('bare_metal', 'vm', 'mig')),
    gpu_count   int  NOT NULL CHECK (gpu_count BETWEEN 1 AND 16),
    gpu_model   text,
    mig_profile text,
    deleted     boolean NOT NULL DEFAULT false,
    version     int  NOT NULL DEFAULT 1
);
INSERT INTO shapes (name, kind, gpu_count, mig_profile) VALUES
    ('vm.1gpu', 'vm', 1, NULL), ('vm.2gpu', 'vm', 2, NULL), ('vm.4gpu', 'vm', 4, NULL),
    ('vm.8gpu', 'vm', 8, NULL), ('bm.8gpu', 'bare_metal', 8, NULL), ('mig.1g.10gb', 'mig', 1, '1g.10gb');

-- status: registered (declared, no topology) | pending_approval (a proposal awaits an admin)
--       | schedulable (an approved map, matching discovery) | needs_review (discovery differs from it)
CREATE TABLE nodes (
    id                uuid PRIMARY KEY,
    name              text NOT NULL UNIQUE,
    gpu_model         text NOT NULL,
    gpu_count         int  NOT NULL CHECK (gpu_count > 0),
    pool              text NOT NULL DEFAULT 'shared',
    region            text NOT NULL DEFAULT 'region-1',
    site              text NOT NULL DEFAULT 'site-1',
    rack              text NOT NULL DEFAULT 'rack-1',
    labels            jsonb NOT NULL DEFAULT '{}'::jsonb,
    taints            jsonb NOT NULL DEFAULT '{}'::jsonb,
    cordoned          boolean NOT NULL DEFAULT false,
    declared          boolean NOT NULL DEFAULT true,   -- false: known only from a topology report so far
    status            text NOT NULL DEFAULT 'registered'
                      CHECK (status IN ('registered', 'pending_approval', 'schedulable', 'needs_review')),
    driver            text,
    topology          jsonb,
    proposal          int NOT NULL DEFAULT 0,
    proposed_slot_map jsonb,
    approved_slot_map jsonb,
    review            jsonb NOT NULL DEFAULT '[]'::jsonb,
    version           int NOT NULL DEFAULT 1,
    created_at        timestamptz NOT NULL DEFAULT now()
);

-- One row per approved slot (GPU + NVMe + IB VF, reserved together). A slot is free when allocation_id
-- IS NULL; a slot with an empty wipe policy is never schedulable; a slot that a newer approved map no
-- longer has is retired (kept while an allocation still holds it, never claimed again). A GPU serving
-- MIG holds up to the profile's count of instances: a capacity counter, claimed conditionally too.
CREATE TABLE slots (
    node_id       uuid NOT NULL REFERENCES nodes (id),
    idx           int  NOT NULL CHECK (idx >= 0),
    detail        jsonb NOT NULL DEFAULT '{}'::jsonb,
    wipe_policy   text NOT NULL DEFAULT '',
    retired       boolean NOT NULL DEFAULT false,
    mig_profile   text,                        -- set while the GPU is partitioned into MIG instances
    mig_used      int NOT NULL DEFAULT 0 CHECK (mig_used >= 0),
    allocation_id uuid,
    reserved_at   timestamptz,
    PRIMARY KEY (node_id, idx),
    CHECK ((allocation_id IS NULL) = (reserved_at IS NULL)),
    CHECK (allocation_id IS NULL OR mig_used = 0)
);
CREATE INDEX slots_allocation ON slots (allocation_id) WHERE allocation_id IS NOT NULL;

-- One row per placed allocation: what it holds and what it was charged (for refunds and preemption).
CREATE TABLE allocations (
    allocation_id uuid PRIMARY KEY,
    tenant_id     uuid NOT NULL,
    user_id       uuid,
    node_id       uuid NOT NULL REFERENCES nodes (id),
    slots         int[] NOT NULL,
    shape         text NOT NULL,
    gpu_model     text NOT NULL,
    pool          text NOT NULL,
    gpus          int  NOT NULL,
    priority      int  NOT NULL DEFAULT 0,
    spot          boolean NOT NULL DEFAULT false,
    mig_profile   text,
    placed_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX allocations_tenant ON allocations (tenant_id, gpu_model, pool);

-- user_id = the nil uuid is the tenant's own quota; any other is a tenant admin's split for one user.
-- used may exceed limit (a lowered quota blocks new allocations, never evicts).
CREATE TABLE quotas (
    tenant_id  uuid NOT NULL,
    gpu_model  text NOT NULL,
    pool       text NOT NULL,
    user_id    uuid NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000',
    "limit"    int  NOT NULL CHECK ("limit" >= 0),
    guaranteed int  NOT NULL DEFAULT 0 CHECK (guaranteed >= 0),
    used       int  NOT NULL DEFAULT 0 CHECK (used >= 0),
    version    int  NOT NULL DEFAULT 1,
    published  int  NOT NULL DEFAULT 0,   -- the version last sent as quota_changed (use changes are coalesced)
    PRIMARY KEY (tenant_id, gpu_model, pool, user_id)
);
CREATE INDEX quotas_unpublished ON quotas (tenant_id) WHERE published <> version;

-- The queue: requests that wait for capacity, with the saga step to answer when they are placed.
CREATE TABLE pending (
    allocation_id   uuid PRIMARY KEY,
    tenant_id       uuid NOT NULL,
    request         jsonb NOT NULL,            -- the ReserveSlots command as received
    correlation_id  text NOT NULL,
    idempotency_key text NOT NULL UNIQUE,
    priority        int  NOT NULL DEFAULT 0,
    enqueued_at     timestamptz NOT NULL DEFAULT now(),
    nominated_node  uuid
);
CREATE INDEX pending_tenant ON pending (tenant_id);

CREATE TABLE preemptions (
    victim         uuid PRIMARY KEY,
    victim_tenant  uuid NOT NULL,
    preemptor      uuid NOT NULL,
    node_id        uuid NOT NULL,
    reason         text NOT NULL,
    grace_deadline timestamptz NOT NULL,
    sent_at        timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX preemptions_due ON preemptions (grace_deadline) WHERE sent_at IS NULL;

-- The claim path in one round trip (adapters/claims.py): charge the tenant's quota, then the user's split if
-- one is set, then take the slots and record the allocation, each conditionally. All or nothing: the
-- exception block is a subtransaction, so a failed condition undoes whatever the claim had written and the
-- function answers why instead of aborting the caller's transaction.
-- Returns {"details": [slot detail...]} or {"error": "taken"} or {"error": "quota", "user": uuid|null,
-- "limit": int|null, "used": int}.
CREATE FUNCTION claim(p_alloc uuid, p_tenant uuid, p_user uuid, p_node uuid, p_slots int[], p_shape text,
                      p_model text, p_pool text, p_units int, p_priority int, p_spot boolean, p_mig text,
                      p_mig_per_gpu int) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
    nil constant uuid := '00000000-0000-0000-0000-000000000000';
    who uuid;
    q record;
    details jsonb;
    why text;
BEGIN
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
    RETURN jsonb_build_object('details', details);
EXCEPTION WHEN raise_exception THEN
    GET STACKED DIAGNOSTICS why = PG_EXCEPTION_DETAIL;
    RETURN why::jsonb;
END $$;
