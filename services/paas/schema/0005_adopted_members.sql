-- A cluster over allocations the tenant already holds: such a member is `adopted`. The cluster never releases it;
-- when it leaves (scale-in, delete) it is `returned`, its allocation still ACTIVE, and it may become a node of
-- another cluster later. So a membership is one cluster's node, and an allocation is a live node of one cluster at
-- most (a returned, released or failed membership is history).
ALTER TABLE members ADD COLUMN IF NOT EXISTS adopted boolean NOT NULL DEFAULT false;
ALTER TABLE members DROP CONSTRAINT IF EXISTS members_pkey;
ALTER TABLE members ADD PRIMARY KEY (cluster_id, allocation_id);
CREATE INDEX IF NOT EXISTS members_allocation ON members (allocation_id);
CREATE UNIQUE INDEX IF NOT EXISTS members_live_allocation ON members (allocation_id)
    WHERE state NOT IN ('released', 'failed', 'returned');
