-- Node health (domain/health.py): each node's state and current alerts, its history, the provider's policy that
-- classifies conditions, and each pool's automatic-cordon breaker.
CREATE TABLE node_health (
    node_id        uuid PRIMARY KEY REFERENCES nodes (id),
    state          text NOT NULL CHECK (state IN ('unknown', 'healthy', 'suspect', 'unreachable', 'reconciling')),
    since          timestamptz NOT NULL DEFAULT now(),
    last_seen      timestamptz,
    alerts         jsonb NOT NULL DEFAULT '[]'::jsonb,
    acted          jsonb NOT NULL DEFAULT '[]'::jsonb,   -- keys of the alerts already acted on
    cordoned_by    text,                                 -- the condition whose classification cordoned the node
    draining       boolean NOT NULL DEFAULT false,
    drain_deadline timestamptz,
    version        int NOT NULL DEFAULT 1
);

CREATE TABLE node_health_history (
    id       bigserial PRIMARY KEY,
    node_id  uuid NOT NULL REFERENCES nodes (id),
    at       timestamptz NOT NULL DEFAULT now(),
    state    text NOT NULL,
    event    text NOT NULL,
    alerts   jsonb NOT NULL DEFAULT '[]'::jsonb
);
CREATE INDEX node_health_history_node ON node_health_history (node_id, id DESC);

CREATE TABLE health_policy (
    condition       text PRIMARY KEY,
    classifications text[] NOT NULL,
    note            text NOT NULL DEFAULT '',
    version         int NOT NULL DEFAULT 1
);

CREATE TABLE health_breakers (
    pool      text PRIMARY KEY,
    open      boolean NOT NULL DEFAULT false,
    opened_at timestamptz,
    cordons   timestamptz[] NOT NULL DEFAULT '{}',
    version   int NOT NULL DEFAULT 1
);
