-- The node's BMC (bare metal through Redfish) and the evidence of every wipe the node ran.

-- One row per node: the BMC as the gateway registered it, the password sealed with the platform key
-- (shared.secrets, purpose 'bmc:<node id>'); the highest version wins (set_bmc is idempotent).
CREATE TABLE bmcs (
    node_id    uuid PRIMARY KEY,
    version    int NOT NULL,
    bmc        jsonb,                      -- contracts_hw.Bmc, or null once removed
    set_by     uuid NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Every slot wipe (release step or a provider admin's re-wipe): the evidence as the node recorded it.
CREATE TABLE wipes (
    id            bigserial PRIMARY KEY,
    node_id       uuid NOT NULL,
    allocation_id uuid,                    -- null: a re-wipe
    request_id    uuid,                    -- the re-wipe's request
    slot          int NOT NULL,
    ok            boolean NOT NULL,
    evidence      jsonb NOT NULL,
    recorded_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX wipes_allocation ON wipes (allocation_id) WHERE allocation_id IS NOT NULL;
