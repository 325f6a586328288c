-- The dashboard's reads (services/gateway/adapters/dashboard.py) at fleet scale.

-- every tenant's allocations newest first (the operator's list; the latency chart's window)
CREATE INDEX IF NOT EXISTS allocations_view_newest ON allocations_view (created_at DESC, id DESC);
-- the allocations holding slots on a page of nodes (the fleet map)
CREATE INDEX IF NOT EXISTS allocations_view_live_by_node ON allocations_view (node_id)
    WHERE state IN ('PROVISIONING', 'ACTIVE', 'RELEASING');
-- each tenant's line (queue depth)
CREATE INDEX IF NOT EXISTS allocations_view_queued ON allocations_view (tenant_id) WHERE state = 'QUEUED';
-- the operator's stream polls the newest node change every second
CREATE INDEX IF NOT EXISTS nodes_view_changed ON nodes_view (changed_at);
CREATE INDEX IF NOT EXISTS node_capacity_view_changed ON node_capacity_view (changed_at);
CREATE INDEX IF NOT EXISTS node_health_view_changed ON node_health_view (changed_at);
