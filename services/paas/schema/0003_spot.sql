-- Spot offerings: one per pool, the whole offering (its settings and nodes) as one document, changed under the
-- row's lock; spot_nodes finds the offering of an allocation (every allocation's events reach this service).
CREATE TABLE spot_offerings (
    pool       text PRIMARY KEY,
    doc        jsonb NOT NULL,
    enabled    boolean NOT NULL,
    version    bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE spot_nodes (
    allocation_id uuid PRIMARY KEY,
    pool          text NOT NULL REFERENCES spot_offerings (pool)
);
