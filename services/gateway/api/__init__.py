"""The HTTP API, one package per thing a user manages. ``ENDPOINTS``: every /v1 endpoint, in the order the OpenAPI
document lists them."""
from .allocations import console, power
from .allocations import routes as allocations
from .audit import routes as audit
from .billing import budgets, invoices
from .billing import usage as billing
from .identity import api_keys, auth, ssh_keys, tenants
from .inventory import bmc, images, nodes, pools, quotas, shapes, wipes
from .limits import routes as rate_limits
from .networks import routes as networks
from .ops import routes as ops
from .policies import routes as policies
from .storage import attachments as volume_attachments
from .storage import quotas as storage_quotas
from .storage import volumes

ENDPOINTS = [*auth.ENDPOINTS, *tenants.ENDPOINTS, *ssh_keys.ENDPOINTS, *nodes.ENDPOINTS, *bmc.ENDPOINTS,
             *pools.ENDPOINTS, *shapes.ENDPOINTS, *images.ENDPOINTS, *quotas.ENDPOINTS, *allocations.ENDPOINTS,
             *power.ENDPOINTS, *console.ENDPOINTS, *wipes.ENDPOINTS, *ops.ENDPOINTS, *networks.ENDPOINTS,
             *storage_quotas.ENDPOINTS, *volumes.ENDPOINTS, *volume_attachments.ENDPOINTS,
             *billing.ENDPOINTS, *invoices.ENDPOINTS, *budgets.ENDPOINTS,
             *api_keys.ENDPOINTS, *policies.ENDPOINTS, *rate_limits.ENDPOINTS,
             *audit.ENDPOINTS]
