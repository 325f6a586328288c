"""Kubernetes clusters on a tenant's own allocations, rendered: kubeadm configurations, Cluster API (bring your own
host) manifests and batch Jobs, validated offline and handed to an applier. No Kubernetes server runs here, so
the one applier records what it would apply; a real one would be another class behind the same protocol."""
