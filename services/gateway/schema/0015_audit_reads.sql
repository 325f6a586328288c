-- Privileged reads are audited too (services/gateway/domain/audit.py AUDITED_READS: a console read, the audit
-- and FOCUS exports), so a record's method may be GET. Rows already there all satisfy the new check.
ALTER TABLE audit_log DROP CONSTRAINT audit_log_method_check;
ALTER TABLE audit_log ADD CONSTRAINT audit_log_method_check CHECK (method IN ('POST', 'PUT', 'PATCH', 'DELETE', 'GET'));
