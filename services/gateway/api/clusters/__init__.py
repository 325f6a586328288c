"""Tenant clusters (Slurm, Ray, Kubernetes) over the tenant's allocations, fronting the paas service."""
