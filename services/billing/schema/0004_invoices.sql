-- Invoices per tenant per UTC month (services/billing/domain/invoices.py has the rules): a draft grows while
-- its period runs and during the grace period, then it is finalized and never changes again.
--
-- Every ledger entry is billed on exactly one invoice: invoice_entries.ledger_seq is the primary key. A line
-- sums its entries (amount_minor, exact usage quantity, count); the entry, its line and the invoice's version
-- are written in the rating transaction that appends the ledger entry (handlers/invoices.assign).
--
-- A finalized invoice is immutable, in the layers 0002_ledger.sql uses for the ledger:
--   1. the service role (tessera_billing, which owns these tables) is denied DELETE and TRUNCATE on all three
--      and UPDATE on invoice_entries: it never removes a line, an entry or an invoice;
--   2. triggers refuse, for any role (a superuser too), any UPDATE or DELETE of a finalized invoice's row and
--      any INSERT, UPDATE or DELETE of its lines and entries (and TRUNCATE of the three tables). The line and
--      entry triggers read the invoice FOR SHARE, so they wait for a finalizer holding it and see its outcome;
--   3. what an owner or superuser can still do (drop the triggers, session_replication_role = replica) is
--      visible through content_hash, published with the finalized document (billing.invoice_changed).

CREATE TABLE invoices (
    id            uuid PRIMARY KEY,
    tenant_id     uuid NOT NULL,
    number        text NOT NULL,                   -- TSR-<YYYYMM>-<tenant prefix>: readable, not an identity
    period_start  timestamptz NOT NULL,
    period_end    timestamptz NOT NULL CHECK (period_end > period_start),
    grace_until   timestamptz NOT NULL CHECK (grace_until >= period_end),
    status        text NOT NULL DEFAULT 'draft' CHECK (status IN ('draft', 'finalized')),
    version       bigint NOT NULL DEFAULT 1 CHECK (version > 0),
    dirty         boolean NOT NULL DEFAULT true,   -- changed since last published (billing.invoice_changed)
    finalized_at  timestamptz,
    content_hash  text CHECK (content_hash ~ '^[0-9a-f]{64}$'),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (tenant_id, period_start),
    -- finalized: hashed, stamped and published in the same transaction (never dirty afterwards)
    CHECK ((status = 'finalized') = (finalized_at IS NOT NULL AND content_hash IS NOT NULL)),
    CHECK (NOT (status = 'finalized' AND dirty))
);
CREATE INDEX invoices_due ON invoices (grace_until) WHERE status = 'draft';
CREATE INDEX invoices_dirty ON invoices (updated_at) WHERE dirty;

CREATE TABLE invoice_lines (
    invoice_id          uuid NOT NULL REFERENCES invoices (id),
    line_key            text NOT NULL,
    description         text NOT NULL,
    kind                text NOT NULL CHECK (kind IN ('gpu', 'storage')),
    correction          boolean NOT NULL DEFAULT false,
    corrects_period     text CHECK (corrects_period ~ '^[0-9]{4}-[0-9]{2}$'),
    sku_price_id        text,
    price_list_version  text,
    unit                text NOT NULL CHECK (unit IN ('GPU-hours', 'GB-hours')),
    usage_quantity      numeric NOT NULL CHECK (usage_quantity >= 0),  -- GPU-seconds or byte-seconds, exact
    amount_minor        bigint NOT NULL,
    currency            char(3) NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    entries             integer NOT NULL CHECK (entries > 0),
    PRIMARY KEY (invoice_id, line_key),
    CHECK (correction = (corrects_period IS NOT NULL))
);

CREATE TABLE invoice_entries (
    -- one invoice per ledger entry. No FOREIGN KEY to ledger_entries: its check locks the ledger row (FOR KEY
    -- SHARE), which needs the UPDATE privilege the service role is denied there; ledger rows are never removed.
    ledger_seq  bigint PRIMARY KEY,
    invoice_id  uuid NOT NULL,
    line_key    text NOT NULL,
    billed_at   timestamptz NOT NULL DEFAULT now(),
    FOREIGN KEY (invoice_id, line_key) REFERENCES invoice_lines (invoice_id, line_key)
);
CREATE INDEX invoice_entries_invoice ON invoice_entries (invoice_id);

CREATE OR REPLACE FUNCTION invoice_refuse_finalized() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'finalized' THEN
        RAISE EXCEPTION 'invoice % is finalized: % refused', OLD.id, TG_OP
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'late usage is a correction line on a later invoice; a finalized invoice never changes';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION invoice_part_refuse_finalized() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    touched uuid[] := '{}';
    frozen uuid;
BEGIN
    IF TG_OP <> 'INSERT' THEN touched := touched || OLD.invoice_id; END IF;
    IF TG_OP <> 'DELETE' THEN touched := touched || NEW.invoice_id; END IF;
    -- lock first, then look (two statements: the second takes a new snapshot), so a finalizer holding the
    -- invoice is waited for and its outcome seen
    PERFORM 1 FROM invoices WHERE id = ANY (touched) ORDER BY id FOR SHARE;
    SELECT id INTO frozen FROM invoices WHERE id = ANY (touched) AND status = 'finalized' LIMIT 1;
    IF frozen IS NOT NULL THEN
        RAISE EXCEPTION 'invoice % is finalized: % on %.% refused', frozen, TG_OP, TG_TABLE_SCHEMA, TG_TABLE_NAME
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'late usage is a correction line on a later invoice; a finalized invoice never changes';
    END IF;
    IF TG_OP = 'DELETE' THEN
        RETURN OLD;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER invoices_finalized_frozen BEFORE UPDATE OR DELETE ON invoices
    FOR EACH ROW EXECUTE FUNCTION invoice_refuse_finalized();
CREATE TRIGGER invoice_lines_finalized_frozen BEFORE INSERT OR UPDATE OR DELETE ON invoice_lines
    FOR EACH ROW EXECUTE FUNCTION invoice_part_refuse_finalized();
CREATE TRIGGER invoice_entries_finalized_frozen BEFORE INSERT OR UPDATE OR DELETE ON invoice_entries
    FOR EACH ROW EXECUTE FUNCTION invoice_part_refuse_finalized();
CREATE TRIGGER invoices_no_truncate BEFORE TRUNCATE ON invoices
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER invoice_lines_no_truncate BEFORE TRUNCATE ON invoice_lines
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_change();
CREATE TRIGGER invoice_entries_no_truncate BEFORE TRUNCATE ON invoice_entries
    FOR EACH STATEMENT EXECUTE FUNCTION ledger_refuse_change();

REVOKE DELETE, TRUNCATE ON invoices, invoice_lines, invoice_entries FROM tessera_billing;
REVOKE UPDATE ON invoice_entries FROM tessera_billing;
