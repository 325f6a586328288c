"""Jobs on the tenant's clusters: one API whatever the cluster's kind, fronting the paas service."""
