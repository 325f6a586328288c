"""The PaaS domain: clusters, jobs, autoscaling and spot decisions, without I/O."""
