"""The allocate, release and reschedule sagas, each a table of steps.

Each step names the participant's declared step (``shared.steps.Step``, in the participant's contracts
module): the command that performs it, the replies that end it, the undo command that compensates it
(allocate saga only) and the reply that confirms the undo. What is the saga's own business stays here:
``fields`` builds the command's own fields from the saga *context* (the saga's input merged with what
earlier, succeeded steps ``yields``: node and slots from the reservation, addresses from the attachment,
the volume id); ``subject`` names the commands' subject parameters (the node-agent listens per node), each the
command's own field of that name, else the context value. A release saga's steps are the participants' undo
commands run as steps of their own (``Step.undo_step``).

A definition may also send a notice, a command that is not a step (nothing to wait for or undo):
``on_failure`` when it ends failed. Its ``fields`` read the saga's facts: saga_id, allocation_id, tenant_id,
failed_step and reason. Nothing is sent when a saga starts: the allocation stays REQUESTED until it is activated
(a notice would cost a command, its event and a transaction on each side, per allocation), and the saga's own
``saga.started`` tells the operators.

Pure data: no I/O (the coordinator validates every command against its contract when it writes it to the
outbox).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from services.allocation.contracts import ACTIVATE, FAIL_ALLOCATION, MARK_RELEASED
from services.billing.contracts import START_METER
from services.network.contracts import ATTACH_NETWORK, BIND_PORT
from services.node_agent.contracts import FENCE_NODE, PROVISION_NODE, WIPE_SLOTS
from services.scheduler.contracts import RESERVE_SLOTS
from services.storage.contracts import PROVISION_VOLUME
from shared.steps import Step

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


def _undo_keeping(*names: str) -> FieldBuilder:
    """A release step's undo command with the context values that earlier release steps yielded (when any)."""
    some = _some(*names)
    return lambda ctx: {"compensates": None, **some(ctx)}


def _volume(ctx: Context) -> dict:
    """The scratch size (the request's volume_gb), the volumes it names, and where they are to be mounted."""
    return {"size_gb": ctx.get("volume_gb", 0),
            **_some("scratch_class", "volumes", "user_id", "node_id", "ip_address")(ctx)}


def _node(ctx: Context) -> dict:
    """What the node-agent provisions: the slots, the network attachment, the guest, and the volumes to mount
    (the exports provision_volume answered with)."""
    fields = _some("node_id", "slots", "volume_id", "ip_address", "mac_address", "attachment", "tenant_networks",
                   "slot_details", "guest")(ctx)
    if ctx.get("exports"):
        fields["volumes"] = ctx["exports"]
    return fields


def _port(ctx: Context) -> dict:
    """A bare-metal server's port (where its NIC is cabled, as its node-agent reported it) and HCA GUIDs."""
    return _some("node_id", "switch_port", "hca_guids")(ctx)


def _activate(ctx: Context) -> dict:
    """The instance as the tenant sees it: a bare-metal server's port move is one of its phases, and its network
    phase is the tenant's once the port was moved. With the reservation's GPU model and pool: the activated event
    carries them to billing, which meters the allocation from its activation."""
    fields = _some("node_id", "instance", "gpu_model", "pool")(ctx)
    if fields.get("instance") and ctx.get("moved_s") is not None:
        instance = dict(fields["instance"])
        instance["network_phase"] = "tenant"
        instance["phases"] = [*(instance.get("phases") or []), {"name": "port_to_tenant", "seconds": ctx["moved_s"]}]
        fields["instance"] = instance
    return fields


@dataclass(frozen=True)
class Needs:
    """What a step needs in the saga's context to have anything to do, when no single value says it: ``test``
    true; ``what`` names it in the skip's detail ("skipped: no <what>")."""

    what: str
    test: Callable[[Context], bool]


def _wants_storage(ctx: Context) -> bool:
    """A scratch volume or named volumes were asked for (a volume attached later is the storage service's own
    business: the release saga's delete_volume always runs)."""
    return bool(ctx.get("volume_gb")) or bool(ctx.get("volumes"))


@dataclass(frozen=True)
class SagaStep:
    name: str
    contract: Step                       # the participant's declared step: its commands and replies
    fields: FieldBuilder = _nothing      # step-specific fields of the command
    undo_fields: FieldBuilder = _nothing  # step-specific fields of the undo command
    # subject parameters of both commands: each the command's own field of that name, else the context value
    subject: tuple[str, ...] = ()
    # reply fields later steps need; "a.b": the field b of the reply's field a, as "b"
    yields: tuple[str, ...] = ()
    # context value without which the step has nothing to do (skipped), or a test of the context (``Needs``)
    requires: str | Needs | None = None
    # the skip for want of ``requires`` is the common case (a VM slice has no switch port): recorded, not published
    quiet_skip: bool = False
    skip_if: str | None = None           # context value with which the step has nothing to do (skipped)

    def has_work(self, ctx: Context) -> bool:
        """Whether the context has what ``requires`` names (always, when it names nothing)."""
        r = self.requires
        if r is None:
            return True
        return r.test(ctx) if isinstance(r, Needs) else ctx.get(r) is not None

    @property
    def needed(self) -> str:
        """What the step's skip for want of ``requires`` says is missing."""
        r = self.requires
        return r.what if isinstance(r, Needs) else str(r)

    # the message types, from the declaration
    @property
    def invoke(self) -> str:
        """Command type that performs the step."""
        return self.contract.command.type

    @property
    def ok(self) -> str:
        """Reply type: the step succeeded."""
        return self.contract.ok.type

    @property
    def fail(self) -> str | None:
        """Reply type: the participant refused (nothing was done)."""
        return self.contract.failed.type if self.contract.failed else None

    @property
    def progress(self) -> str | None:
        """Reply type: still working (e.g. queued); the deadline moves to the queue timeout."""
        return self.contract.progress.type if self.contract.progress else None

    @property
    def compensate(self) -> str | None:
        """Undo command type (None: nothing to undo)."""
        return self.contract.undo.type if self.contract.undo else None

    @property
    def undone(self) -> str | None:
        """Reply type confirming the undo."""
        return self.contract.undone.type if self.contract.undone else None


@dataclass(frozen=True)
class Notice:
    """A command the saga sends without waiting for a reply (not a step: nothing to time out or undo)."""

    contract: Step
    fields: FieldBuilder

    @property
    def type(self) -> str:
        return self.contract.command.type


@dataclass(frozen=True)
class SagaDefinition:
    kind: Literal["allocate", "release", "reschedule"]
    steps: tuple[SagaStep, ...]
    # "compensate": a failure or timeout undoes the completed steps in reverse order.
    # "retry": forward-only; a step without a reply is resent with backoff until it is confirmed.
    recovery: Literal["compensate", "retry"]
    on_failure: Notice | None = None     # sent when the saga ends failed

    @property
    def names(self) -> list[str]:
        return [s.name for s in self.steps]

    def step(self, name: str) -> SagaStep | None:
        return next((s for s in self.steps if s.name == name), None)

    def after(self, name: str) -> SagaStep | None:
        names = self.names
        i = names.index(name) + 1
        return self.steps[i] if i < len(names) else None

    @property
    def contracts(self) -> list[Step]:
        """Every declared step this saga uses: its notice and its steps."""
        notices = [self.on_failure.contract] if self.on_failure else []
        return notices + [s.contract for s in self.steps]


_FAILED = Notice(FAIL_ALLOCATION, _pick("allocation_id", "saga_id", "failed_step", "reason"))

ALLOCATE = SagaDefinition(
    "allocate", recovery="compensate",
    steps=(
        SagaStep("reserve_slots", RESERVE_SLOTS, yields=("node_id", "slots", "slot_details", "gpu_model", "pool"),
                 fields=_some("shape", "gpu_count", "user_id", "priority", "spot", "pool", "tolerations", "fail_fast")),
        SagaStep("attach_network", ATTACH_NETWORK, fields=_some("node_id", "network_id"),
                 yields=("ip_address", "mac_address", "attachment", "tenant_networks")),
        # an allocation that asks for no storage skips the step (quietly: the common case for a VM slice)
        SagaStep("provision_volume", PROVISION_VOLUME, fields=_volume, yields=("volume_id", "exports"),
                 requires=Needs("volumes", _wants_storage), quiet_skip=True),
        SagaStep("provision_node", PROVISION_NODE,
                 fields=_node, undo_fields=_pick("node_id"), subject=("node_id",),
                 yields=("instance", "instance.switch_port", "instance.hca_guids")),
        # bare metal: deployed on the provisioning network, the server's port moves to its tenant network before the
        # allocation is active (undone: back to the provisioning network, before the server is powered off)
        SagaStep("bind_port", BIND_PORT, fields=_port, requires="switch_port", quiet_skip=True, yields=("moved_s",)),
        # no meter step: billing starts the allocation's meter on its allocation.activated (as it stops it on its
        # allocation.failed), so metering costs the allocation no step of its own
        SagaStep("activate", ACTIVATE, fields=_activate),
    ),
    on_failure=_FAILED,
)

# a release of an allocation withdrawn from its tenant's line before its allocate saga started: nothing was
# reserved, so every step but mark_released is skipped (services/saga/handlers/withdrawals.py)
_WITHDRAWN = "withdrawn"

RELEASE = SagaDefinition(
    "release", recovery="retry",
    steps=(
        SagaStep("stop_meter", START_METER.undo_step, fields=_undo(), skip_if=_WITHDRAWN),
        SagaStep("deprovision_node", PROVISION_NODE.undo_step, fields=_undo("node_id"), subject=("node_id",),
                 requires="node_id", skip_if=_WITHDRAWN),
        # bare metal: the server (off) goes back to the provisioning network, where it is cleaned, before the wipe
        SagaStep("unbind_port", BIND_PORT.undo_step, fields=_undo(), requires="switch_port", quiet_skip=True,
                 skip_if=_WITHDRAWN),
        # no slot returns to the pool unwiped: the slots stay the allocation's while they are wiped, and those
        # whose wipe failed are quarantined instead of freed (release_slots' quarantine)
        SagaStep("wipe_slots", WIPE_SLOTS, fields=_some("node_id", "slots", "slot_details"), subject=("node_id",),
                 requires="node_id", yields=("quarantine",), skip_if=_WITHDRAWN),
        SagaStep("delete_volume", PROVISION_VOLUME.undo_step, fields=_undo(), skip_if=_WITHDRAWN),
        SagaStep("detach_network", ATTACH_NETWORK.undo_step, fields=_undo(), skip_if=_WITHDRAWN),
        SagaStep("release_slots", RESERVE_SLOTS.undo_step, fields=_undo_keeping("quarantine"), skip_if=_WITHDRAWN),
        SagaStep("mark_released", MARK_RELEASED),
    ),
    on_failure=_FAILED,
)


def _pause(ctx: Context) -> dict:
    """Stop the meter when the tenant lost the allocation (the interruption), not when the saga got to it."""
    return {"compensates": None, **_some("at")({"at": ctx.get("interrupted_at")})}


def _quarantine_old(ctx: Context) -> dict:
    """Free the old placement's slots into quarantine: whatever the tenant left there was never wiped (the node
    failed, or is being drained), so they come back only through a provider admin's re-wipe."""
    reason = f"held by allocation {ctx.get('allocation_id')} when it was moved off the node; not wiped"
    return {"compensates": None, "quarantine": [{"slot": s, "reason": reason} for s in ctx.get("old_slots") or ()]}


# set in the input of a move of a bare-metal allocation (its placement's instance was made by the redfish driver):
# without it the server is not powered off (a VM slice is fenced through the network, and when its node answers)
_BARE_METAL = "bare_metal"


def _old_node(ctx: Context) -> dict:
    """The fence is addressed to the node the allocation ran on (its field, and so its subject), not the new one."""
    return {"node_id": ctx.get("from_node_id")}


def _keep_address(ctx: Context) -> dict:
    """The new attachment asks for the address the allocation had (the tenant keeps it when it is free)."""
    return {**_some("node_id", "network_id")(ctx), **_some("ip_address")({"ip_address": ctx.get("kept_ip_address")})}


# An interrupted allocation moves: pause its meter, power its bare-metal server off (confirmed), fence its old port
# out of the tenant's network, free its old slots (into quarantine: unwiped), then place, attach (same address),
# provision it on a healthy node as the allocate saga does, and activate it there (same allocation id; billing
# meters it again from that activation).
# Its volumes stay where they are (the storage service keeps the allocation's scratch and named volumes, exported
# to its address), so provision_volume finds them. The first four steps have nothing to undo (the old placement
# is gone for good); a failure after them undoes the new placement's steps and fails the allocation. A bare-metal
# fence that is refused or times out fails the allocation before anything is placed: an allocation never runs in
# two places, even at the cost of its availability. What the old node of a VM slice still runs is fenced when it
# answers again (the scheduler's monitor).
_MOVE = {s.name: s for s in ALLOCATE.steps}
RESCHEDULE = SagaDefinition(
    "reschedule", recovery="compensate",
    steps=(
        SagaStep("pause_meter", START_METER.undo_step, fields=_pause),
        SagaStep("fence_node", FENCE_NODE, fields=_old_node, subject=("node_id",), requires=_BARE_METAL),
        SagaStep("fence_network", ATTACH_NETWORK.undo_step, fields=_undo()),
        SagaStep("free_old_slots", RESERVE_SLOTS.undo_step, fields=_quarantine_old),
        _MOVE["reserve_slots"],
        SagaStep("attach_network", ATTACH_NETWORK, fields=_keep_address,
                 yields=("ip_address", "mac_address", "attachment", "tenant_networks")),
        # always: the allocation may have had volumes attached since it was created, and they must let its new
        # address in
        replace(_MOVE["provision_volume"], requires=None, quiet_skip=False),
        _MOVE["provision_node"], _MOVE["bind_port"], _MOVE["activate"],
    ),
    on_failure=_FAILED,
)

DEFINITIONS: dict[str, SagaDefinition] = {d.kind: d for d in (ALLOCATE, RELEASE, RESCHEDULE)}


def sent_and_received() -> tuple[list[str], list[str]]:
    """(every command the sagas send, every reply they wait for), in table order, each once: what the
    coordinator's contract sends and receives besides the saga starts."""
    sends: dict[str, None] = {}
    receives: dict[str, None] = {}
    for definition in DEFINITIONS.values():
        for step in definition.contracts:
            sends.update(dict.fromkeys(m.type for m in step.commands))
            receives.update(dict.fromkeys(m.type for m in step.replies))
    return list(sends), list(receives)


def context(saga, definition: SagaDefinition) -> dict[str, Any]:
    """The saga's input merged with what its succeeded steps yielded, in step order."""
    ctx = dict(saga.input)
    for step in definition.steps:
        rec = saga.steps.get((step.name, "invoke"))
        if rec is not None and rec.status == "succeeded" and rec.result:
            for name in step.yields:
                field, _, inner = name.partition(".")
                if field not in rec.result:
                    continue
                value = rec.result[field]
                if inner:
                    value = value.get(inner) if isinstance(value, dict) else None
                    if value is None:
                        continue
                ctx[inner or field] = value
    return ctx
