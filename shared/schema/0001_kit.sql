-- Transactional outbox: rows are written in the same transaction as the state change.
-- The relay publishes unpublished rows (whatever their id order), with Nats-Msg-Id = id.
CREATE TABLE outbox (
    id           uuid PRIMARY KEY,
    seq          bigserial NOT NULL,
    subject      text NOT NULL,
    type         text NOT NULL,
    headers      jsonb NOT NULL,
    body         bytea NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
);
CREATE INDEX outbox_unpublished ON outbox (seq) WHERE published_at IS NULL;

-- Idempotent inbox: one row per (consumer, event) processed, written with the effect.
CREATE TABLE inbox (
    consumer     text NOT NULL,
    event_id     uuid NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, event_id)
);

-- Saga participants: outcome per idempotency key (saga id, step).
-- status: done | failed | compensated (a compensation tombstone makes a late invoke a no-op).
CREATE TABLE step_outcomes (
    idempotency_key text PRIMARY KEY,
    status          text NOT NULL CHECK (status IN ('done', 'failed', 'compensated')),
    result          jsonb NOT NULL DEFAULT '{}'::jsonb,
    updated_at      timestamptz NOT NULL DEFAULT now()
);
