-- Refusals shown on their object (scheduler.admin_command_rejected names the kind of its target).
-- A node whose registration the scheduler refused is 'rejected' (the reason in last_rejection) and no
-- longer holds its name: the admin registers it again, corrected, under the same name.
ALTER TABLE nodes_view DROP CONSTRAINT IF EXISTS nodes_view_status_check;
ALTER TABLE nodes_view ADD CONSTRAINT nodes_view_status_check
    CHECK (status IN ('registering', 'registered', 'pending_approval', 'schedulable', 'needs_review', 'rejected'));
ALTER TABLE nodes_view DROP CONSTRAINT IF EXISTS nodes_view_name_key;
CREATE UNIQUE INDEX IF NOT EXISTS nodes_view_live_name ON nodes_view (name) WHERE status <> 'rejected';

-- node | shape | pool | quota | allocation; NULL: refused before the scheduler named the kind
ALTER TABLE admin_rejections ADD COLUMN IF NOT EXISTS target_kind text;
