-- Scheduling and network options of the request (priority, spot, pool, tolerations, fail_fast, network_id).
ALTER TABLE allocations ADD COLUMN options jsonb NOT NULL DEFAULT '{}'::jsonb;
