-- Each tenant's line (TESSERA_SAGA_TENANT_INFLIGHT, services/saga/domain/lines.py).
-- One row per tenant: locked while one of its requests is admitted or put in line, so coordinator replicas
-- count the tenant's allocate sagas in flight one at a time.
CREATE TABLE saga_tenants (tenant_id uuid PRIMARY KEY);

-- Requests waiting for a place in their tenant's line, first come first served (seq). The input is the
-- allocate saga's; the saga is created when the request leaves the line.
CREATE TABLE saga_waiting (
    seq           bigserial PRIMARY KEY,
    allocation_id uuid NOT NULL UNIQUE,
    tenant_id     uuid NOT NULL,
    input         jsonb NOT NULL,
    requested_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX saga_waiting_line ON saga_waiting (tenant_id, seq);

-- The count of a tenant's allocate sagas in flight.
CREATE INDEX sagas_in_flight ON sagas (tenant_id) WHERE kind = 'allocate' AND status IN ('running', 'compensating');
