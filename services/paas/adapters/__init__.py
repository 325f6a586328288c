"""Drivers of the tenant clusters' schedulers (Slurm, Ray: real; Kubernetes: rendered) and of the spot market."""
