-- A tenant's overlay network. Every tenant has at most one default network; CIDRs may overlap
-- between tenants (the VNI isolates them), VNIs never do.
CREATE TABLE tenant_networks (
    id         uuid PRIMARY KEY,
    tenant_id  uuid NOT NULL,
    is_default boolean NOT NULL DEFAULT true,
    vni        int NOT NULL UNIQUE CHECK (vni BETWEEN 1 AND 16777215),
    cidr       cidr NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX tenant_networks_one_default ON tenant_networks (tenant_id) WHERE is_default;

-- One attachment per allocation; an address (and a MAC) is unique within its network.
CREATE TABLE attachments (
    id            uuid PRIMARY KEY,
    allocation_id uuid NOT NULL UNIQUE,
    network_id    uuid NOT NULL REFERENCES tenant_networks (id),
    ip_address    inet NOT NULL,
    mac_address   macaddr NOT NULL,
    node_id       uuid NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    UNIQUE (network_id, ip_address),
    UNIQUE (network_id, mac_address)
);
