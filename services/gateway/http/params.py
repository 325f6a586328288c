"""The path parameters several slices name (one definition each, so the OpenAPI document describes them alike)."""
from __future__ import annotations

import uuid

from .endpoint import Param

TENANT_ID = Param("tenant_id", "path", "The tenant's id.", uuid.UUID, required=True)
USER_ID = Param("user_id", "path", "The user's id (a user of this tenant).", uuid.UUID, required=True)
ALLOCATION_ID = Param("allocation_id", "path", "The allocation's id.", uuid.UUID, required=True)
NODE_ID = Param("node_id", "path", "The node's id.", uuid.UUID, required=True)
