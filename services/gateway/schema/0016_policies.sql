-- Policies (Cedar): the provider's (scope provider, no tenant) and each tenant's (scope tenant). One row per policy,
-- its current version; every version ever stored stays in policy_versions (a delete keeps them, marked deleted).
-- Depends on 0001 (tenants).
CREATE TABLE policies (
    id          uuid PRIMARY KEY,
    scope       text NOT NULL CHECK (scope IN ('provider', 'tenant')),
    tenant_id   uuid REFERENCES tenants (id),
    name        text NOT NULL,
    description text NOT NULL DEFAULT '',
    version     int  NOT NULL,
    text        text NOT NULL,
    enabled     boolean NOT NULL,
    created_by  uuid NOT NULL,
    updated_by  uuid NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    CHECK ((scope = 'tenant') = (tenant_id IS NOT NULL))
);
CREATE INDEX policies_by_tenant ON policies (tenant_id, created_at);

CREATE TABLE policy_versions (
    policy_id   uuid NOT NULL,
    version     int  NOT NULL,
    scope       text NOT NULL,
    tenant_id   uuid,
    name        text NOT NULL,
    description text NOT NULL,
    text        text NOT NULL,
    enabled     boolean NOT NULL,
    deleted     boolean NOT NULL DEFAULT false,
    by          uuid NOT NULL,
    at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (policy_id, version)
);
