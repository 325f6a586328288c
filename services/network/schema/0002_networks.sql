-- Issue 4: several named networks per tenant, provider pools, security rules, fabric calls.

-- Every value handed out from a provider pool, once: the primary key makes a duplicate impossible
-- even if two transactions raced past the pool's advisory lock. Pools: 'vni' (network VNIs and
-- tenants' L3 VNIs), 'vrf', 'pkey', 'nat' (IPv4 as integer), 'vlan:<leaf>' (leaf-local VLAN ids).
CREATE TABLE pool_leases (
    pool       text   NOT NULL,
    value      bigint NOT NULL,
    owner      uuid   NOT NULL,            -- the network or tenant holding it
    leased_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pool, value),
    UNIQUE (pool, owner)
);
INSERT INTO pool_leases (pool, value, owner) SELECT 'vni', vni, id FROM tenant_networks;

ALTER TABLE tenant_networks ADD COLUMN name text NOT NULL DEFAULT 'default';
ALTER TABLE tenant_networks ALTER COLUMN name DROP DEFAULT;
ALTER TABLE tenant_networks ADD COLUMN nat_address inet UNIQUE;
ALTER TABLE tenant_networks ADD CONSTRAINT tenant_networks_name_per_tenant UNIQUE (tenant_id, name);
ALTER TABLE tenant_networks ALTER COLUMN is_default SET DEFAULT false;

-- A tenant's fabric identity while it has networks; the row (and its version) outlives them,
-- so the version a node-agent compares only ever grows.
CREATE TABLE tenants (
    tenant_id  uuid PRIMARY KEY,
    version    bigint NOT NULL DEFAULT 0,
    vrf_table  int UNIQUE,
    pkey       int UNIQUE CHECK (pkey BETWEEN 1 AND 32766),
    l3_vni     int UNIQUE CHECK (l3_vni BETWEEN 1 AND 16777215)
);
INSERT INTO tenants (tenant_id) SELECT DISTINCT tenant_id FROM tenant_networks;

CREATE TABLE security_rules (
    id                uuid PRIMARY KEY,
    network_id        uuid NOT NULL REFERENCES tenant_networks (id) ON DELETE CASCADE,
    direction         text NOT NULL CHECK (direction IN ('ingress', 'egress')),
    protocol          text NOT NULL CHECK (protocol IN ('tcp', 'udp', 'icmp', 'any')),
    port_from         int CHECK (port_from BETWEEN 1 AND 65535),
    port_to           int CHECK (port_to BETWEEN 1 AND 65535),
    remote_network_id uuid REFERENCES tenant_networks (id) ON DELETE CASCADE,
    remote_cidr       cidr,
    created_at        timestamptz NOT NULL DEFAULT now(),
    CHECK ((direction = 'ingress') = (remote_network_id IS NOT NULL AND remote_cidr IS NULL)),
    CHECK ((direction = 'egress') = (remote_cidr IS NOT NULL AND remote_network_id IS NULL))
);
CREATE INDEX security_rules_by_network ON security_rules (network_id, created_at);

-- The fabric identity of an attachment: its VF GUID (unique everywhere) and the leaf serving its node.
ALTER TABLE attachments ADD COLUMN guid text UNIQUE;
ALTER TABLE attachments ADD COLUMN leaf text;
CREATE INDEX attachments_by_leaf ON attachments (leaf, network_id);

-- Every call a fabric driver made, in order: recording drivers "send" here, in the same
-- transaction as the attach or detach that caused it.
CREATE TABLE fabric_calls (
    seq           bigserial PRIMARY KEY,
    driver        text NOT NULL,
    action        text NOT NULL CHECK (action IN ('attach', 'detach')),
    tenant_id     uuid NOT NULL,
    network_id    uuid NOT NULL,
    allocation_id uuid NOT NULL,
    method        text NOT NULL,
    url           text NOT NULL,
    body          jsonb,
    recorded_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX fabric_calls_by_allocation ON fabric_calls (allocation_id, seq);
