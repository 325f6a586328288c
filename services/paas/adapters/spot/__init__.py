"""Drivers of the spot market (``services.paas.domain.spot.SpotCapacityProvider``): NVIDIA Cloud Functions' cluster
agent, recorded (no NGC account nor Kubernetes server in reach)."""
