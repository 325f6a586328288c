-- The provider's spot offerings as the paas service publishes them (paas.spot_offering_changed): one row per pool,
-- the newest document (the highest version wins).
CREATE TABLE IF NOT EXISTS spot_offerings_view (
    pool       text PRIMARY KEY,
    doc        jsonb NOT NULL,
    version    bigint NOT NULL
);
