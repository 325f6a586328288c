"""Storage: volumes, their attachments and storage quotas."""
