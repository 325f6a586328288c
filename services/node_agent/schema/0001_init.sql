-- One schema for every node-agent process; each process only touches rows of its own node_id.
CREATE TABLE instances (
    node_id       uuid NOT NULL,
    allocation_id uuid NOT NULL,
    instance_id   text NOT NULL,
    slots         int[] NOT NULL CHECK (cardinality(slots) > 0),
    state         text NOT NULL DEFAULT 'running' CHECK (state IN ('running')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (node_id, allocation_id)
);
