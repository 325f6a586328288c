"""Every /v1 endpoint of the gateway, in the order the OpenAPI document lists them."""
from . import allocations, auth, nodes, ops, tenants

ENDPOINTS = [*auth.ENDPOINTS, *tenants.ENDPOINTS, *nodes.ENDPOINTS, *allocations.ENDPOINTS, *ops.ENDPOINTS]
