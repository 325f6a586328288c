"""The HTTP route handlers, one module per resource. ``ENDPOINTS``: every /v1 endpoint, in the order the OpenAPI
document lists them."""
from . import allocations, auth, networks, nodes, ops, pools, quotas, shapes, tenants

ENDPOINTS = [*auth.ENDPOINTS, *tenants.ENDPOINTS, *nodes.ENDPOINTS, *pools.ENDPOINTS, *shapes.ENDPOINTS,
             *quotas.ENDPOINTS, *allocations.ENDPOINTS, *ops.ENDPOINTS, *networks.ENDPOINTS]
