"""Tessera's common library: the envelope, contracts, outbox/inbox, bus and runtime kit every service uses."""
