-- The audit trail: one row per mutating API request (POST, PUT, PATCH, DELETE on a declared route, whatever its
-- outcome), appended by services/gateway/http/audit.py through shared.ledger_store.append, so it is hash-chained
-- like the billing ledger (services/billing/schema/0002_ledger.sql, whose three layers of protection this copies:
-- REVOKE from the service role, triggers refusing UPDATE/DELETE/TRUNCATE, and the chain + checkpoints that show
-- what a superuser or the owner changed anyway; GET /v1/ops/audit/verify or `./taskw ledger:verify --table
-- gateway.audit_log`).
--
-- The columns are what GET /v1/audit filters on; ``record`` holds the whole internal record (docs/audit.md):
-- actor, target, outcome, request (the redacted body of a PUT/PATCH), observer. Every column but the two hashes
-- is covered by row_hash. No float anywhere (the chain refuses them).

CREATE TABLE audit_log (
    seq          bigint PRIMARY KEY CHECK (seq > 0),
    audit_id     uuid NOT NULL UNIQUE,
    event_time   timestamptz NOT NULL,              -- when the gateway received the request
    tenant_id    uuid,                              -- the actor's tenant, else the tenant the path names
    user_id      uuid,                              -- null: not authenticated (a 401)
    role         text,
    action       text NOT NULL,                     -- the route's operationId
    method       text NOT NULL CHECK (method IN ('POST', 'PUT', 'PATCH', 'DELETE')),
    path         text NOT NULL,
    target_type  text NOT NULL,
    target_id    text,
    outcome      text NOT NULL CHECK (outcome IN ('success', 'failure', 'unknown')),
    status       integer NOT NULL,
    request_id   text NOT NULL,                     -- the request's OpenTelemetry trace id (32 hex)
    record       jsonb NOT NULL,
    prev_hash    bytea NOT NULL CHECK (octet_length(prev_hash) = 32),
    row_hash     bytea NOT NULL UNIQUE CHECK (octet_length(row_hash) = 32),
    created_at   timestamptz NOT NULL
);
CREATE INDEX audit_log_time ON audit_log (event_time DESC, audit_id DESC);
CREATE INDEX audit_log_tenant_time ON audit_log (tenant_id, event_time DESC, audit_id DESC);
CREATE INDEX audit_log_target ON audit_log (target_type, target_id);
CREATE INDEX audit_log_user ON audit_log (user_id, event_time DESC);

CREATE TABLE audit_log_checkpoints (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tree_size   bigint NOT NULL CHECK (tree_size > 0),
    first_seq   bigint NOT NULL,
    last_seq    bigint NOT NULL,
    root_hash   bytea NOT NULL CHECK (octet_length(root_hash) = 32),
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (first_seq, last_seq),
    CHECK (last_seq - first_seq + 1 = tree_size)
);

CREATE OR REPLACE FUNCTION audit_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%.% is append-only: % refused', TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'the audit trail is never changed or removed';
END
$$;

CREATE TRIGGER audit_log_no_update_delete BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_refuse_change();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_refuse_change();
CREATE TRIGGER audit_log_checkpoints_no_update_delete BEFORE UPDATE OR DELETE ON audit_log_checkpoints
    FOR EACH ROW EXECUTE FUNCTION audit_refuse_change();
CREATE TRIGGER audit_log_checkpoints_no_truncate BEFORE TRUNCATE ON audit_log_checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION audit_refuse_change();

REVOKE UPDATE, DELETE, TRUNCATE ON audit_log, audit_log_checkpoints FROM tessera_gateway;
