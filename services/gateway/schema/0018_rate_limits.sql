-- API rate limits shared by every gateway replica: token buckets (per tenant, per user, per source address; reads
-- and writes apart), the provider's per-tenant overrides of their sizes, and the leases that bound a tenant's open
-- server-sent-event streams. docs/rate-limits.md has the design. Depends on nothing earlier.

-- One bucket per (scope, subject, class). tokens is what was left at updated_at; the refill (rate x elapsed, capped
-- at the burst) is computed when the bucket is next taken from, by the database's clock (replicas' clocks never
-- enter it). A missing row is a full bucket. Unlogged: no WAL per request; after a crash the table is empty, which is
-- every bucket full (a few seconds of generosity, never a refusal).
CREATE UNLOGGED TABLE rate_buckets (
    scope      text NOT NULL CHECK (scope IN ('tenant', 'user', 'address')),
    subject    text NOT NULL,
    class      text NOT NULL CHECK (class IN ('read', 'write')),
    tokens     double precision NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (scope, subject, class)
);

-- The provider admins' per-tenant overrides; a null column: the gateway's setting applies.
CREATE TABLE tenant_rate_limits (
    tenant_id        uuid PRIMARY KEY,
    read_per_s       int CHECK (read_per_s > 0),
    read_burst       int CHECK (read_burst > 0),
    write_per_s      int CHECK (write_per_s > 0),
    write_burst      int CHECK (write_burst > 0),
    user_read_per_s  int CHECK (user_read_per_s > 0),
    user_read_burst  int CHECK (user_read_burst > 0),
    user_write_per_s int CHECK (user_write_per_s > 0),
    user_write_burst int CHECK (user_write_burst > 0),
    sse_connections  int CHECK (sse_connections > 0),
    set_by           uuid NOT NULL,
    set_at           timestamptz NOT NULL DEFAULT now()
);

-- Takes one token from each bucket named (scopes[i], subjects[i], p_class; rates[i] tokens a second, at most
-- bursts[i]) when every one of them has one, else from none. A rate <= 0 is no limit (that bucket is skipped:
-- tokens null). Row locks are taken in the order given and held only for this statement (callers name buckets in
-- the same order: tenant, then user). Returns each bucket's tokens after the take, its rate and burst, and whether
-- the token was taken.
CREATE FUNCTION rate_take(p_class text, p_scopes text[], p_subjects text[], p_rates float8[], p_bursts float8[])
RETURNS TABLE (scope text, tokens float8, rate float8, burst float8, taken boolean)
LANGUAGE plpgsql AS $$
DECLARE
    n int := coalesce(array_length(p_scopes, 1), 0);
    v_left float8[] := array_fill(NULL::float8, ARRAY[n]);
    v_at timestamptz[] := array_fill(NULL::timestamptz, ARRAY[n]);
    v_tokens float8;
    v_updated timestamptz;
    v_now timestamptz;
    v_ok boolean := true;
    i int;
BEGIN
    FOR i IN 1 .. n LOOP
        CONTINUE WHEN p_rates[i] <= 0;
        SELECT b.tokens, b.updated_at INTO v_tokens, v_updated FROM rate_buckets b
         WHERE b.scope = p_scopes[i] AND b.subject = p_subjects[i] AND b.class = p_class FOR NO KEY UPDATE;
        IF NOT FOUND THEN   -- a new bucket, full; another request may be creating it too: then take its row
            INSERT INTO rate_buckets AS b (scope, subject, class, tokens, updated_at)
            VALUES (p_scopes[i], p_subjects[i], p_class, p_bursts[i], clock_timestamp()) ON CONFLICT DO NOTHING;
            SELECT b.tokens, b.updated_at INTO v_tokens, v_updated FROM rate_buckets b
             WHERE b.scope = p_scopes[i] AND b.subject = p_subjects[i] AND b.class = p_class FOR NO KEY UPDATE;
        END IF;
        v_now := clock_timestamp();
        v_left[i] := least(p_bursts[i], v_tokens + p_rates[i] * greatest(0, extract(epoch FROM v_now - v_updated))::float8);
        v_at[i] := greatest(v_updated, v_now);
        v_ok := v_ok AND v_left[i] >= 1;
    END LOOP;
    -- refused: nothing is written (refilling later from the stored state gives the same tokens)
    IF v_ok THEN
        FOR i IN 1 .. n LOOP
            CONTINUE WHEN v_left[i] IS NULL;
            v_left[i] := v_left[i] - 1;
            UPDATE rate_buckets AS b SET tokens = v_left[i], updated_at = v_at[i]
             WHERE b.scope = p_scopes[i] AND b.subject = p_subjects[i] AND b.class = p_class;
        END LOOP;
    END IF;
    FOR i IN 1 .. n LOOP
        scope := p_scopes[i]; tokens := v_left[i]; rate := p_rates[i]; burst := p_bursts[i]; taken := v_ok;
        RETURN NEXT;
    END LOOP;
END $$;

-- A tenant member's request: the tenant's bucket and the user's, sized by the tenant's overrides where set, else by
-- p_defaults (tenant rate, tenant burst, user rate, user burst). One round trip.
CREATE FUNCTION tenant_rate_take(p_tenant uuid, p_user uuid, p_class text, p_defaults float8[])
RETURNS TABLE (scope text, tokens float8, rate float8, burst float8, taken boolean)
LANGUAGE sql AS $$
    SELECT r.* FROM (SELECT 1) AS one
    LEFT JOIN tenant_rate_limits o ON o.tenant_id = p_tenant
    CROSS JOIN LATERAL rate_take(p_class, ARRAY['tenant', 'user'], ARRAY[p_tenant::text, p_user::text],
        ARRAY[coalesce(CASE p_class WHEN 'read' THEN o.read_per_s ELSE o.write_per_s END, p_defaults[1]),
              coalesce(CASE p_class WHEN 'read' THEN o.user_read_per_s ELSE o.user_write_per_s END, p_defaults[3])]::float8[],
        ARRAY[coalesce(CASE p_class WHEN 'read' THEN o.read_burst ELSE o.write_burst END, p_defaults[2]),
              coalesce(CASE p_class WHEN 'read' THEN o.user_read_burst ELSE o.user_write_burst END, p_defaults[4])]::float8[]) r
$$;

-- An open event stream of a tenant holds a lease until it ends; a replica that dies leaves leases that expire
-- (the streams renew theirs well before; a renewal writes the lease again if it is gone, so after a crash of the
-- database, which empties this unlogged table, the open streams count again within a renewal).
CREATE UNLOGGED TABLE sse_leases (
    lease_id   uuid PRIMARY KEY,
    tenant_id  uuid NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX sse_leases_tenant ON sse_leases (tenant_id);

-- A lease for a new stream of the tenant when fewer than its limit (the override, else p_default; a limit <= 0 is
-- none) hold one. Serialised per tenant by a transaction-scoped advisory lock, so two replicas cannot both take the
-- last place. Returns whether it was granted, the streams open (with it) and the limit.
CREATE FUNCTION sse_acquire(p_tenant uuid, p_lease uuid, p_default int, p_ttl_s float8)
RETURNS TABLE (granted boolean, open_streams int, stream_limit int)
LANGUAGE plpgsql AS $$
DECLARE
    v_limit int;
    v_open int;
BEGIN
    SELECT coalesce(o.sse_connections, p_default) INTO v_limit
      FROM (SELECT 1) AS one LEFT JOIN tenant_rate_limits o ON o.tenant_id = p_tenant;
    IF v_limit <= 0 THEN
        RETURN QUERY SELECT true, 0, 0;
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('sse:' || p_tenant::text));
    DELETE FROM sse_leases WHERE tenant_id = p_tenant AND expires_at < clock_timestamp();
    SELECT count(*) INTO v_open FROM sse_leases WHERE tenant_id = p_tenant;
    IF v_open >= v_limit THEN
        RETURN QUERY SELECT false, v_open, v_limit;
        RETURN;
    END IF;
    INSERT INTO sse_leases (lease_id, tenant_id, expires_at)
    VALUES (p_lease, p_tenant, clock_timestamp() + make_interval(secs => p_ttl_s));
    RETURN QUERY SELECT true, v_open + 1, v_limit;
END $$;
