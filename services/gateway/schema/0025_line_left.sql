-- An allocation that waited in its tenant's line and left it (its allocate saga started: saga.allocation_left_line)
-- shows no place any more, and a place told late (another consumer's message) is not shown again.
ALTER TABLE allocations_view ADD COLUMN line_left boolean NOT NULL DEFAULT false;
