"""A saga step, declared once, in the contracts module of the participant that performs it.

A ``Step`` groups the messages of one step: the command that performs it, the reply that it succeeded
(``ok``), the reply that it was refused (``failed``), the command that undoes it (``undo``) with the reply
that confirms the undo (``undone``), and, for a step that may answer later, the reply that it was accepted
and is still waiting (``progress``). A step with a command only is a notice: the saga sends it and waits
for nothing.

    RESERVE_SLOTS = Step.declare(
        "scheduler",
        command=("reserve_slots", ReserveSlots, "Saga step: reserve GPU slots for an allocation."),
        ok=("slots_reserved", SlotsReserved, "Slots were reserved for the allocation."),
        failed=("slot_reservation_failed", SlotReservationFailed, "No slots could be reserved (code says why)."),
        ...)

Everything else derives from the declaration:
- the participant's contract: ``ServiceContract(steps=[...])`` owns the step's messages and receives its
  commands;
- its subscribers: ``rt.consumers.participate(STEP, invoke=..., undo=...)``;
- its replies: ``shared.participant`` answers with the step's messages;
- the saga table (``services/saga/domain/definitions.py``) names the step, and the coordinator's contract
  sends the commands and receives the replies of every step its sagas name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel

from .contract import Message

Part = tuple[str, type[BaseModel], str]     # (name, payload model, summary)


@dataclass(frozen=True)
class Step:
    command: Message
    ok: Message | None = None           # reply: done (None: a notice, nothing to wait for)
    failed: Message | None = None       # reply: refused, nothing was done
    undo: Message | None = None         # command that undoes the step (a compensation, or a release step)
    undone: Message | None = None       # reply: undone
    progress: Message | None = None     # reply: accepted, the final reply comes later (e.g. queued)

    @classmethod
    def declare(cls, service: str, *, command: Part, ok: Part | None = None, failed: Part | None = None,
                undo: Part | None = None, undone: Part | None = None, progress: Part | None = None,
                subject_params: tuple[str, ...] = ()) -> Step:
        """The step's messages with the contract's names and subjects: type ``<service>.<name>``, subject
        ``<service>.cmd.<name>`` (commands) or ``<service>.evt.<name>`` (replies), then ``.{param}`` for
        each of ``subject_params``."""
        suffix = "".join(f".{{{p}}}" for p in subject_params)

        def message(part: Part | None, kind: Literal["command", "event"]) -> Message | None:
            if part is None:
                return None
            name, model, summary = part
            verb = "cmd" if kind == "command" else "evt"
            return Message(f"{service}.{name}", f"{service}.{verb}.{name}{suffix}", model, kind, summary)

        if (undo is None) != (undone is None):
            raise ValueError(f"{service}.{command[0]}: an undo command and its undone reply go together")
        return cls(message(command, "command"), message(ok, "event"), message(failed, "event"),
                   message(undo, "command"), message(undone, "event"), message(progress, "event"))

    @property
    def commands(self) -> list[Message]:
        """What the saga sends: the command, and the undo if there is one."""
        return [m for m in (self.command, self.undo) if m is not None]

    @property
    def replies(self) -> list[Message]:
        """What the participant answers."""
        return [m for m in (self.ok, self.failed, self.progress, self.undone) if m is not None]

    @property
    def messages(self) -> list[Message]:
        return self.commands + self.replies

    @property
    def undo_step(self) -> Step:
        """The undo run as a step of its own (a release saga's step): the undo command, answered ``undone``."""
        if self.undo is None:
            raise ValueError(f"{self.command.type} has no undo")
        return Step(self.undo, ok=self.undone)
