"""The gateway's pure rules and encodings (no I/O)."""
