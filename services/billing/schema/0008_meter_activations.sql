-- Billing meters an allocation from its allocation.activated (the time in the event) and stops the meter on the
-- release's stop_meter, the reschedule's pause, or its allocation.failed. These come on different consumers, so a
-- stop may come before the activation it ends: it is kept here (the time it stops at), and the activation it
-- overtook, when it comes, is metered up to it at once (the earliest stop kept at or after the activation's time).
CREATE TABLE meter_stops_ahead (
    allocation_id uuid        NOT NULL,
    at            timestamptz NOT NULL,
    kept_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (allocation_id, at)
);
-- one meter per activation: an activation told twice (a redelivery, a repeated reply) meters once
CREATE UNIQUE INDEX meters_activation ON meters (allocation_id, started_at);
