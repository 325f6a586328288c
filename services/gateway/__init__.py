"""Tessera's API gateway: the only HTTP entry for tenants and provider admins, with read models of the platform's
events. Layout: domain (pure rules), handlers (HTTP routes), http (plumbing), projections (read models),
adapters (repositories), entrypoints (bus, http, loops), settings and bootstrap."""
