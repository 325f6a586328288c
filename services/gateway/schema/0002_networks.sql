-- Read model of tenant networks, their security rules and attachments, projected from network.* events.
-- A network is 'creating' or a rule 'adding' from the POST until the network service answers.
CREATE TABLE networks_view (
    id           uuid PRIMARY KEY,
    tenant_id    uuid NOT NULL,
    name         text NOT NULL,
    cidr         cidr NOT NULL,
    state        text NOT NULL CHECK (state IN ('creating', 'active', 'deleting', 'deleted', 'rejected')),
    gateway_ip   inet,
    nat_address  inet,
    reason       text,
    requested_by uuid,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
-- one live network per name and tenant (a rejected or deleted one frees its name)
CREATE UNIQUE INDEX networks_view_live_name ON networks_view (tenant_id, name) WHERE state IN ('creating', 'active', 'deleting');
CREATE INDEX networks_view_by_tenant ON networks_view (tenant_id, created_at, id);

CREATE TABLE network_rules_view (
    id                uuid PRIMARY KEY,
    network_id        uuid NOT NULL,
    tenant_id         uuid NOT NULL,
    direction         text NOT NULL,
    protocol          text NOT NULL,
    port_from         int,
    port_to           int,
    remote_network_id uuid,
    remote_cidr       text,
    state             text NOT NULL CHECK (state IN ('adding', 'active', 'removing', 'rejected')),
    reason            text,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX network_rules_view_by_network ON network_rules_view (network_id, created_at, id);

-- One row per allocation; a detach that overtakes its attach leaves a tombstone (detached_at set) so the
-- late attach does not resurrect it.
CREATE TABLE network_attachments_view (
    allocation_id uuid PRIMARY KEY,
    tenant_id     uuid,
    network_id    uuid,
    attachment_id uuid,
    ip_address    inet,
    prefix_len    int,
    mac_address   text,
    node_id       uuid,
    attached_at   timestamptz,
    detached_at   timestamptz
);
CREATE INDEX network_attachments_view_live ON network_attachments_view (network_id, ip_address) WHERE detached_at IS NULL;
