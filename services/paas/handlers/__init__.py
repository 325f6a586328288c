"""The PaaS service's handlers: cluster commands, what others say of a cluster's nodes, jobs, and the reconciler."""
