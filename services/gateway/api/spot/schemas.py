"""HTTP models of a spot offering: what a provider admin sets, and the offering as shown. Bounds are the paas
service's own (services.paas.contracts.SetSpotOffering)."""
from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from services.paas.contracts import CLUSTER_NAME_PATTERN, SpotOfferingChanged

from ...domain.scheduling import TOLERATION
from ...http.schema_base import Body, Out, ShapeName, Uuid, integer, text

Toleration = text(200, pattern=TOLERATION)
MarketName = text(63, min_length=1, pattern=r"^[A-Za-z0-9._-]+$")


class SpotOfferingSet(Body):
    server_owned: ClassVar[frozenset[str]] = frozenset({"pool", "nodes", "offered_gpus", "offered_gpu_s", "version",
                                                        "reclaims_total", "free_gpus", "reserve_gpus", "reason",
                                                        "driver", "updated_at", "gpu_count", "enabled"})
    tenant_id: Uuid = Field(description=(
        "The provider's own tenant whose spot allocations hold the offered GPUs (billed as spot, to the second; it "
        "needs a quota in the pool)."))
    shape: ShapeName = Field(description="Each spot node's shape (GET /v1/shapes).")
    max_nodes: integer(1, 1024) = Field(default=64, description="The most spot nodes it holds.")
    headroom_gpus: integer(0, 100_000) = Field(default=0, description=(
        "GPUs kept free beyond what tenants may claim (their unused guaranteed quota and pending requests)."))
    notice_s: integer(1, 3600) = Field(default=30, description=(
        "Notice a reclaim gives the spot workload before its node is taken back (GCP and Azure give 30 s, AWS "
        "120 s). A tenant's request that preempts a spot node gives the scheduler's preemption grace instead."))
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=16, description="'key=value:NoSchedule' entries: taints of the pool's nodes "
                                                          "its spot allocations tolerate (a dedicated pool's).")
    cluster_name: text(31, min_length=1, pattern=CLUSTER_NAME_PATTERN) | None = Field(
        default=None, description="Its cluster's name in the spot market (default tessera-<pool>); immutable there "
                                  "while it holds nodes.")
    group: MarketName = Field(default="tessera", description="The market's cluster group.")
    region: MarketName = Field(default="local", description="The region the market lists it in.")


class SpotOfferingOut(SpotOfferingChanged):
    """The offering as the paas service last published it."""


class SpotOfferingList(Out):
    items: list[SpotOfferingOut]


class SpotOfferingAccepted(Out):
    """What was asked, on its way to the paas service; ``current`` is the offering as last published (null: none
    yet). Follow GET /v1/spot-offerings/{pool}."""

    pool: str
    enabled: bool = Field(description="What was asked: true (PUT) or false (DELETE).")
    requested: SpotOfferingSet | None = Field(default=None, description="The PUT's settings.")
    current: SpotOfferingOut | None = None
    links: dict[str, str]
