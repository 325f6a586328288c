"""The tenant's event feed: every event of its allocations, live (server-sent events)."""
