"""The HTTP API's request and response models, one module per resource (``base``: what they share)."""
