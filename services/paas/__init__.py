"""PaaS: tenant clusters (Slurm, Ray, Kubernetes) on the tenant's own allocations, one job API over them, autoscaling,
and idle capacity offered as spot."""
