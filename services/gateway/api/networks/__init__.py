"""Tenant networks, their rules and attachments."""
