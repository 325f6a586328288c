"""Rate limits: a tenant's request rates."""
