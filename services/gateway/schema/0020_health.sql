-- Automatic failure handling, as provider admins see it: each node's health document and its history, the
-- provider's health policy, each pool's automatic-cordon breaker (all from the scheduler's health monitor), and the
-- faults provider admins injected into simulated nodes.

-- The newest scheduler.node_health_changed of each node (version-guarded: an older document never replaces it).
CREATE TABLE IF NOT EXISTS node_health_view (
    node_id        uuid PRIMARY KEY,
    pool           text NOT NULL,
    state          text NOT NULL CHECK (state IN ('unknown', 'healthy', 'suspect', 'unreachable', 'reconciling')),
    since          timestamptz NOT NULL,
    last_seen      timestamptz,
    alerts         jsonb NOT NULL DEFAULT '[]'::jsonb,
    cordoned_by    text,
    draining       boolean NOT NULL DEFAULT false,
    drain_deadline timestamptz,
    breaker_open   boolean NOT NULL DEFAULT false,
    version        int NOT NULL CHECK (version >= 1),
    changed_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS node_health_view_state ON node_health_view (state);

-- Every document's history line (its ``event``), once per node and version, whatever order they arrive in.
CREATE TABLE IF NOT EXISTS node_health_history (
    node_id     uuid NOT NULL,
    version     int  NOT NULL,
    state       text NOT NULL,
    event       text NOT NULL,
    alerts      int  NOT NULL,
    occurred_at timestamptz NOT NULL,
    PRIMARY KEY (node_id, version)
);

-- The classifications of each condition (scheduler.health_policy_changed; the leader announces every row at start).
CREATE TABLE IF NOT EXISTS health_policy_view (
    condition       text PRIMARY KEY,
    classifications jsonb NOT NULL DEFAULT '[]'::jsonb,
    note            text NOT NULL DEFAULT '',
    requested_by    uuid,
    version         int NOT NULL CHECK (version >= 1),
    changed_at      timestamptz NOT NULL DEFAULT now()
);

-- Each pool's automatic-cordon breaker (scheduler.breaker_changed).
CREATE TABLE IF NOT EXISTS health_breakers_view (
    pool              text PRIMARY KEY,
    open              boolean NOT NULL,
    opened_at         timestamptz,
    cordons_in_window int NOT NULL DEFAULT 0,
    share             double precision NOT NULL,
    window_s          double precision NOT NULL,
    version           int NOT NULL CHECK (version >= 1),
    changed_at        timestamptz NOT NULL DEFAULT now()
);

-- A fault a provider admin injected (POST /v1/nodes/{id}/faults) and the node's answer
-- (node_agent.fault_injected: accepted NULL until it comes). An answer to a fault not injected through this
-- gateway (no requested_by) is kept too.
CREATE TABLE IF NOT EXISTS fault_injections (
    request_id   uuid PRIMARY KEY,
    node_id      uuid NOT NULL,
    kind         text NOT NULL,
    gpu          int,
    code         int,
    value        double precision,
    duration_s   double precision,
    requested_by uuid,
    requested_at timestamptz NOT NULL DEFAULT now(),
    accepted     boolean,
    reason       text,
    answered_at  timestamptz
);
CREATE INDEX IF NOT EXISTS fault_injections_node ON fault_injections (node_id, requested_at);
