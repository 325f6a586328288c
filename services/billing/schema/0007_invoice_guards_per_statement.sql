-- The guard of a finalized invoice's lines and entries (0004_invoices.sql), per statement for INSERT and
-- UPDATE. A row trigger ran two queries per row: a rating transaction billing a batch of entries paid
-- them per entry, inside the ledger's lock, where they were most of the batch's time. The statement
-- triggers below see every row the statement inserted or updated (transition tables; an INSERT … ON
-- CONFLICT DO UPDATE fires both) and do the same two steps once: lock the invoices touched FOR SHARE (so a
-- finalizer holding one is waited for and its outcome seen), then refuse the statement if any of them is
-- finalized. Raising in an AFTER trigger undoes the whole statement, as the row trigger's refusal did.
-- DELETE keeps its row trigger: its refusal must come before the foreign-key checks of the same statement
-- (and the service role may not delete at all).

CREATE OR REPLACE FUNCTION invoice_refuse_frozen(touched uuid[], op text, tbl text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    frozen uuid;
BEGIN
    -- lock first, then look (two statements: the second takes a new snapshot)
    PERFORM 1 FROM invoices WHERE id = ANY (touched) ORDER BY id FOR SHARE;
    SELECT id INTO frozen FROM invoices WHERE id = ANY (touched) AND status = 'finalized' LIMIT 1;
    IF frozen IS NOT NULL THEN
        RAISE EXCEPTION 'invoice % is finalized: % on % refused', frozen, op, tbl
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'late usage is a correction line on a later invoice; a finalized invoice never changes';
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION invoice_parts_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM invoice_refuse_frozen(ARRAY(SELECT DISTINCT invoice_id FROM inserted), TG_OP,
                                  TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME);
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION invoice_parts_updated() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM invoice_refuse_frozen(ARRAY(SELECT invoice_id FROM before_update UNION SELECT invoice_id FROM after_update),
                                  TG_OP, TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME);
    RETURN NULL;
END
$$;

DROP TRIGGER invoice_lines_finalized_frozen ON invoice_lines;
DROP TRIGGER invoice_entries_finalized_frozen ON invoice_entries;

CREATE TRIGGER invoice_lines_finalized_frozen BEFORE DELETE ON invoice_lines
    FOR EACH ROW EXECUTE FUNCTION invoice_part_refuse_finalized();
CREATE TRIGGER invoice_entries_finalized_frozen BEFORE DELETE ON invoice_entries
    FOR EACH ROW EXECUTE FUNCTION invoice_part_refuse_finalized();
CREATE TRIGGER invoice_lines_inserted_frozen AFTER INSERT ON invoice_lines
    REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION invoice_parts_inserted();
CREATE TRIGGER invoice_lines_updated_frozen AFTER UPDATE ON invoice_lines
    REFERENCING OLD TABLE AS before_update NEW TABLE AS after_update
    FOR EACH STATEMENT EXECUTE FUNCTION invoice_parts_updated();
CREATE TRIGGER invoice_entries_inserted_frozen AFTER INSERT ON invoice_entries
    REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION invoice_parts_inserted();
CREATE TRIGGER invoice_entries_updated_frozen AFTER UPDATE ON invoice_entries
    REFERENCING OLD TABLE AS before_update NEW TABLE AS after_update
    FOR EACH STATEMENT EXECUTE FUNCTION invoice_parts_updated();
