-- The node's desired network inputs, so reconcile works after a restart.
-- One row per tenant with the highest snapshot version seen; one row per plumbed attachment.
CREATE TABLE tenant_networks (
    node_id    uuid NOT NULL,
    tenant_id  uuid NOT NULL,
    version    bigint NOT NULL CHECK (version >= 1),
    snapshot   jsonb NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (node_id, tenant_id)
);

CREATE TABLE attachments (
    node_id       uuid NOT NULL,
    allocation_id uuid NOT NULL,
    tenant_id     uuid NOT NULL,
    attachment    jsonb NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (node_id, allocation_id)
);
