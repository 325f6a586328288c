-- A bare-metal server's switch port while it is on its tenant's network (handed off): one row per allocation.
-- No row: the port is on the provisioning network (deploy, cleaning), where the leaf's day-0 configuration puts it.
CREATE TABLE port_bindings (
    allocation_id uuid PRIMARY KEY,
    tenant_id     uuid NOT NULL,
    network_id    uuid NOT NULL,
    node_id       uuid NOT NULL,
    leaf          text NOT NULL,
    port          text NOT NULL,
    vlan          int  NOT NULL CHECK (vlan BETWEEN 1 AND 4094),
    vni           int  NOT NULL,
    hca_guids     text[] NOT NULL DEFAULT '{}',
    bound_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (leaf, port)                  -- a port is on one tenant network at a time
);

-- the kernel leaf driver records what it ran; every driver records the port moves it rendered
ALTER TABLE fabric_calls DROP CONSTRAINT fabric_calls_action_check;
ALTER TABLE fabric_calls ADD CONSTRAINT fabric_calls_action_check
    CHECK (action IN ('attach', 'detach', 'bind', 'unbind'));
