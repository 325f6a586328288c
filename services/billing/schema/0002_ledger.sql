-- The billing ledger: append-only, hash-chained (shared/chain.py, shared/ledger_store.py), with Merkle
-- checkpoints. Rows are written only through shared.ledger_store.append, which serialises appends with a
-- per-table advisory lock, so seq is gap-free and prev_hash is the previous row's row_hash.
--
-- Who can change a row: this migration runs as the service's own role (tessera_billing, shared/runtime.py
-- migrates over the service's pool), which therefore owns these tables. Three layers:
--   1. REVOKE UPDATE, DELETE, TRUNCATE from tessera_billing: an owner's ordinary privileges can be revoked
--      like anyone's, so the service's own statements are refused with "permission denied";
--   2. triggers raising on UPDATE, DELETE (per row) and TRUNCATE (per statement; row triggers never fire on
--      TRUNCATE), for any role that still holds the privilege (another role granted it, a superuser);
--   3. the hashes themselves: an owner can re-grant itself the privileges or disable the triggers (ALTER
--      TABLE needs only ownership), and a superuser bypasses triggers (session_replication_role = replica).
--      What stops such a change from going unnoticed is the chain and the checkpoints (`./taskw ledger:verify`),
--      and the checkpoints' roots published outside this database (left for the wiring).
-- Moving ownership to an administrative role would close the owner's loophole, but the migration cannot do it
-- (ALTER ... OWNER TO needs membership of the new owner) and shared.db.provision_service is not billing's.

CREATE TABLE ledger_entries (
    seq           bigint PRIMARY KEY CHECK (seq > 0),
    tenant_id     uuid NOT NULL,
    kind          text NOT NULL CHECK (kind IN ('charge', 'correction')),
    source_event  text NOT NULL UNIQUE,       -- idempotency: the usage event this entry rates
    amount_minor  bigint NOT NULL,            -- integer minor units (cents): never a float in a hash
    currency      char(3) NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    entry         jsonb NOT NULL,
    prev_hash     bytea NOT NULL CHECK (octet_length(prev_hash) = 32),
    row_hash      bytea NOT NULL UNIQUE CHECK (octet_length(row_hash) = 32),
    created_at    timestamptz NOT NULL
);
CREATE INDEX ledger_entries_tenant ON ledger_entries (tenant_id, seq);

CREATE TABLE ledger_entries_checkpoints (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    tree_size   bigint NOT NULL CHECK (tree_size > 0),
    first_seq   bigint NOT NULL,
    last_seq    bigint NOT NULL,
    root_hash   bytea NOT NULL CHECK (octet_length(root_hash) = 32),
    created_at  timestamptz NOT NULL DEFAULT now(),
    UNIQUE (first_seq, last_seq),
    CHECK (last_seq - first_seq + 1 = tree_size)
);

CREATE OR REPLACE FUNCTION ledger_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%.% is append-only: % refused', TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'corrections are new entries (kind = correction); rows are never changed or removed';
END
$$;

CREATE TRIGGER ledger_entries_no_update_delete BEFORE UPDATE OR DELETE ON ledger_entries
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER ledger_entries_no_truncate BEFORE TRUNCATE ON ledger_entries
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER ledger_entries_checkpoints_no_update_delete BEFORE UPDATE OR DELETE ON ledger_entries_checkpoints
    FOR EACH ROW EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER ledger_entries_checkpoints_no_truncate BEFORE TRUNCATE ON ledger_entries_checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_change();

REVOKE UPDATE, DELETE, TRUNCATE ON ledger_entries, ledger_entries_checkpoints FROM tessera_billing;
