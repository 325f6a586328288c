-- A tenant's weight: its share of each consumer's service while its messages wait with other tenants' (its plan,
-- set by a provider admin). The gateway stamps it on the messages it sends for the tenant (shared.fairness).
ALTER TABLE tenants ADD COLUMN weight int NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 100);
