CREATE TABLE nodes (
    id         uuid PRIMARY KEY,
    name       text NOT NULL UNIQUE,
    gpu_model  text NOT NULL,
    gpu_count  int  NOT NULL CHECK (gpu_count > 0),
    labels     jsonb NOT NULL DEFAULT '{}'::jsonb,
    cordoned   boolean NOT NULL DEFAULT false,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- One row per GPU slot; a slot is free when allocation_id IS NULL. The primary key makes a slot one
-- row, so a slot can never hold two allocations; reservations lock the node row before claiming.
CREATE TABLE slots (
    node_id       uuid NOT NULL REFERENCES nodes (id),
    idx           int  NOT NULL CHECK (idx >= 0),
    allocation_id uuid,
    reserved_at   timestamptz,
    PRIMARY KEY (node_id, idx),
    CHECK ((allocation_id IS NULL) = (reserved_at IS NULL))
);
CREATE INDEX slots_allocation ON slots (allocation_id) WHERE allocation_id IS NOT NULL;
