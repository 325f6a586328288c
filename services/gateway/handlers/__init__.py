"""The HTTP route handlers, one module per resource. ``ENDPOINTS``: every /v1 endpoint, in the order the OpenAPI
document lists them."""
from . import (allocations, audit, auth, bmc, console, images, networks, nodes, ops, pools, power, quotas, shapes,
               ssh_keys, storage_quotas, tenants, volume_attachments, volumes, wipes)
from . import api_keys, billing, budgets, invoices, policies, rate_limits

ENDPOINTS = [*auth.ENDPOINTS, *tenants.ENDPOINTS, *ssh_keys.ENDPOINTS, *nodes.ENDPOINTS, *bmc.ENDPOINTS,
             *pools.ENDPOINTS, *shapes.ENDPOINTS, *images.ENDPOINTS, *quotas.ENDPOINTS, *allocations.ENDPOINTS,
             *power.ENDPOINTS, *console.ENDPOINTS, *wipes.ENDPOINTS, *ops.ENDPOINTS, *networks.ENDPOINTS,
             *storage_quotas.ENDPOINTS, *volumes.ENDPOINTS, *volume_attachments.ENDPOINTS,
             *billing.ENDPOINTS, *invoices.ENDPOINTS, *budgets.ENDPOINTS,
             *api_keys.ENDPOINTS, *policies.ENDPOINTS, *rate_limits.ENDPOINTS,
             *audit.ENDPOINTS]
