"""Identity: tenants, users, tokens, API keys, SSH keys and signing keys."""
