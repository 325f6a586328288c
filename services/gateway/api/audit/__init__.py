"""The audit trail: reading, exporting and verifying it."""
