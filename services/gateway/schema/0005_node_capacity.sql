-- A node's free slots as the scheduler counted them after each change that took or freed slots: carried by
-- scheduler.slots_reserved, scheduler.slots_released and scheduler.node_changed with the node's capacity
-- sequence; a count is applied only when its seq is newer, whatever order the consumers see them in.
-- A table of its own, apart from nodes_view: a count may arrive before the node's first document, and the
-- document's version (a document change) and the capacity sequence are separate orders.
-- GET /v1/nodes/{id} shows free_slots from here (0 unless the node is schedulable) and seq as capacity_version.
CREATE TABLE IF NOT EXISTS node_capacity_view (
    node_id    uuid PRIMARY KEY,
    free_slots int    NOT NULL,
    seq        bigint NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT now()
);
