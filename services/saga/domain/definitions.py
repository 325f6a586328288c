"""The allocate and release sagas, each a table of steps (STYLE.md §4).

A step names the command that performs it, the replies that end it and (allocate
saga only) the undo command that compensates it with the reply that confirms the
undo. ``fields`` builds the command's own fields from the saga *context*: the
saga's input merged with what earlier, succeeded steps ``yields`` (node and slots
from the reservation, addresses from the attachment, the volume id). ``subject``
names context values that are subject parameters (the node-agent listens per node).

Pure data: no I/O, no wire models (the coordinator validates every command
against its contract when it writes it to the outbox).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping

Context = Mapping[str, Any]
FieldBuilder = Callable[[Context], dict]


def _nothing(_ctx: Context) -> dict:
    return {}


def _pick(*names: str) -> FieldBuilder:
    def build(ctx: Context) -> dict:
        return {n: ctx.get(n) for n in names}
    return build


def _some(*names: str) -> FieldBuilder:
    """Like _pick, but leaves out values the context does not have (the command's defaults apply)."""
    def build(ctx: Context) -> dict:
        return {n: ctx[n] for n in names if ctx.get(n) is not None}
    return build


def _undo(*names: str) -> FieldBuilder:
    """Release steps are undo commands that compensate nothing (``compensates`` = None)."""
    def build(ctx: Context) -> dict:
        return {"compensates": None, **{n: ctx.get(n) for n in names}}
    return build


def _volume(ctx: Context) -> dict:
    return {"size_gb": ctx.get("volume_gb", 0)}


@dataclass(frozen=True)
class Step:
    name: str
    invoke: str                          # command type that performs the step
    ok: str                              # reply type: the step succeeded
    fail: str | None = None              # reply type: the participant refused (nothing was done)
    compensate: str | None = None        # undo command type (None: nothing to undo)
    undone: str | None = None            # reply type confirming the undo
    fields: FieldBuilder = _nothing      # step-specific fields of the command
    undo_fields: FieldBuilder = _nothing  # step-specific fields of the undo command
    subject: tuple[str, ...] = ()        # context values that are subject parameters of both commands
    yields: tuple[str, ...] = ()         # reply fields later steps need
    requires: str | None = None          # context value without which the step has nothing to do (skipped)
    progress: str | None = None          # reply type: still working (e.g. queued); the deadline moves to the queue timeout


@dataclass(frozen=True)
class SagaDefinition:
    kind: Literal["allocate", "release"]
    steps: tuple[Step, ...]
    # "compensate": a failure or timeout undoes the completed steps in reverse order.
    # "retry": forward-only; a step without a reply is resent with backoff until it is confirmed.
    on_failure: Literal["compensate", "retry"]

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.steps]

    def step(self, name: str) -> Step | None:
        return next((s for s in self.steps if s.name == name), None)

    def after(self, name: str) -> Step | None:
        names = self.names
        i = names.index(name) + 1
        return self.steps[i] if i < len(names) else None


ALLOCATE = SagaDefinition("allocate", on_failure="compensate", steps=(
    Step("reserve_slots", "scheduler.reserve_slots", ok="scheduler.slots_reserved",
         fail="scheduler.slot_reservation_failed", compensate="scheduler.release_slots", undone="scheduler.slots_released",
         fields=_some("shape", "gpu_count", "user_id", "priority", "spot", "pool", "tolerations", "fail_fast"),
         yields=("node_id", "slots"), progress="scheduler.reservation_queued"),
    Step("attach_network", "network.attach_network", ok="network.network_attached",
         fail="network.network_attach_failed", compensate="network.detach_network", undone="network.network_detached",
         fields=_some("node_id", "network_id"), yields=("ip_address", "mac_address", "attachment", "tenant_networks")),
    Step("provision_volume", "storage.provision_volume", ok="storage.volume_provisioned",
         fail="storage.volume_provision_failed", compensate="storage.delete_volume", undone="storage.volume_deleted",
         fields=_volume, yields=("volume_id",)),
    Step("provision_node", "node_agent.provision", ok="node_agent.node_provisioned",
         fail="node_agent.node_provision_failed", compensate="node_agent.deprovision", undone="node_agent.node_deprovisioned",
         fields=_some("node_id", "slots", "volume_id", "ip_address", "mac_address", "attachment", "tenant_networks"),
         undo_fields=_pick("node_id"),
         subject=("node_id",)),
    Step("start_meter", "billing.start_meter", ok="billing.meter_started",
         fail="billing.meter_start_failed", compensate="billing.stop_meter", undone="billing.meter_stopped",
         fields=_pick("shape", "gpu_count")),
    Step("activate", "allocation.activate", ok="allocation.activated",
         fail="allocation.activation_failed", fields=_pick("node_id")),
))

RELEASE = SagaDefinition("release", on_failure="retry", steps=(
    Step("stop_meter", "billing.stop_meter", ok="billing.meter_stopped", fields=_undo()),
    Step("deprovision_node", "node_agent.deprovision", ok="node_agent.node_deprovisioned",
         fields=_undo("node_id"), subject=("node_id",), requires="node_id"),
    Step("delete_volume", "storage.delete_volume", ok="storage.volume_deleted", fields=_undo()),
    Step("detach_network", "network.detach_network", ok="network.network_detached", fields=_undo()),
    Step("release_slots", "scheduler.release_slots", ok="scheduler.slots_released", fields=_undo()),
    Step("mark_released", "allocation.mark_released", ok="allocation.released", fail="allocation.release_failed"),
))

DEFINITIONS: dict[str, SagaDefinition] = {d.kind: d for d in (ALLOCATE, RELEASE)}


def context(saga, definition: SagaDefinition) -> dict[str, Any]:
    """The saga's input merged with what its succeeded steps yielded, in step order."""
    ctx = dict(saga.input)
    for step in definition.steps:
        rec = saga.steps.get((step.name, "invoke"))
        if rec is not None and rec.status == "succeeded" and rec.result:
            ctx.update({k: rec.result[k] for k in step.yields if k in rec.result})
    return ctx
