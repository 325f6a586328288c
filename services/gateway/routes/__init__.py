"""Every /v1 endpoint of the gateway, in the order the OpenAPI document lists them."""
from . import allocations, auth, inventory, nodes, ops, quotas, shapes, tenants

ENDPOINTS = [*auth.ENDPOINTS, *tenants.ENDPOINTS, *nodes.ENDPOINTS, *inventory.ENDPOINTS, *shapes.ENDPOINTS,
             *quotas.ENDPOINTS, *allocations.ENDPOINTS, *ops.ENDPOINTS]
