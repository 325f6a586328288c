"""A tenant's job as the API takes it, the tenant's job policy, and the job's lifecycle (pure, no I/O).

``check`` answers every reason a job cannot go to its cluster at once (each a :class:`Violation` naming the
field and the rule), so a user fixes a request in one round. ``runtime_command`` turns an accepted request into
the argv ``JobSpec.command`` carries. :class:`Lifecycle` holds the job's state: impossible moves are refused and
a terminal state is final.
"""
from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from services.paas.domain.runtime import TERMINAL, ClusterKind

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
RESERVED_ENV_PREFIXES = ("SLURM_", "RAY_", "CUDA_", "TESSERA_")   # the schedulers' and the platform's own
MAX_ARGV = 64
MAX_ARG_CHARS = 4096
MAX_ENTRYPOINT_BYTES = 16 * 1024
MAX_TASKS = 1024
MAX_GPUS_PER_TASK = 16
MIN_TIME_LIMIT_S = 60
MAX_TIME_LIMIT_S = 7 * 24 * 3600
MAX_ENV = 64
MAX_ENV_VALUE_CHARS = 4096

# An OCI image reference, as the distribution project's grammar writes it: [host[:port]/]path[:tag][@digest].
_HOST = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?))*(?::[0-9]+)?"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE = re.compile(rf"^(?:{_HOST}/)?{_PATH}(?:/{_PATH})*(?::[\w][\w.-]{{0,127}})?"
                   r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$")
MAX_IMAGE_CHARS = 255 + 1 + 128 + 1 + 128   # name, tag and digest at their longest


@dataclass(frozen=True)
class JobRequest:
    """A job as a tenant user submits it: ``command`` (an argv) or ``entrypoint`` (a shell line), exactly one."""

    cluster_id: uuid.UUID
    name: str
    command: tuple[str, ...] | None = None
    entrypoint: str | None = None
    tasks: int = 1
    gpus_per_task: int = 0
    time_limit_s: int = 3600
    env: Mapping[str, str] = field(default_factory=dict)
    image: str | None = None
    privileged: bool = False

    @property
    def gpus(self) -> int:
        return self.tasks * self.gpus_per_task


@dataclass(frozen=True)
class JobPolicy:
    """What a tenant's jobs may ask for. ``max_gpus_per_job`` None: the cluster's GPUs are the only bound;
    ``allowed_images``: glob patterns (``nvcr.io/nvidia/*``), empty for any image."""

    max_gpus_per_job: int | None = None
    allow_privileged: bool = False
    allowed_images: tuple[str, ...] = ()
    max_time_limit_s: int = MAX_TIME_LIMIT_S


@dataclass(frozen=True)
class Violation:
    field: str      # the request's field, with the item where there is one: "command[2]", "env.SLURM_JOB_ID"
    rule: str       # a stable word for the rule broken: "range", "reserved", "not_allowed"…
    message: str


def validate(request: JobRequest) -> list[Violation]:
    """The request's own rules, whatever the cluster and the policy."""
    found: list[Violation] = []
    if not NAME.match(request.name):
        found.append(Violation("name", "pattern", "a lower-case DNS label of 1 to 63 characters"))
    found += _program(request)
    found += _range("tasks", request.tasks, 1, MAX_TASKS)
    found += _range("gpus_per_task", request.gpus_per_task, 0, MAX_GPUS_PER_TASK)
    found += _range("time_limit_s", request.time_limit_s, MIN_TIME_LIMIT_S, MAX_TIME_LIMIT_S)
    found += _env(request.env)
    if request.image is not None and (len(request.image) > MAX_IMAGE_CHARS or not IMAGE.match(request.image)):
        found.append(Violation("image", "pattern", "an OCI image reference: [registry/]path[:tag][@digest]"))
    return found


def _range(name: str, value: int, low: int, high: int) -> list[Violation]:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return [Violation(name, "range", f"an integer from {low} to {high}")]
    return []


def _program(request: JobRequest) -> list[Violation]:
    if (request.command is None) == (request.entrypoint is None):
        return [Violation("command", "exclusive", "give exactly one of command (an argv) and entrypoint")]
    if request.entrypoint is not None:
        if "\x00" in request.entrypoint:
            return [Violation("entrypoint", "nul", "must not hold a NUL character")]
        if not request.entrypoint.strip() or len(request.entrypoint.encode()) > MAX_ENTRYPOINT_BYTES:
            return [Violation("entrypoint", "length", f"a shell line of 1 to {MAX_ENTRYPOINT_BYTES} bytes")]
        return []
    argv = request.command or ()
    if not 1 <= len(argv) <= MAX_ARGV:
        return [Violation("command", "length", f"1 to {MAX_ARGV} arguments")]
    found = []
    for i, arg in enumerate(argv):
        if not isinstance(arg, str) or len(arg) > MAX_ARG_CHARS:
            found.append(Violation(f"command[{i}]", "length", f"a string of at most {MAX_ARG_CHARS} characters"))
        elif "\x00" in arg:
            found.append(Violation(f"command[{i}]", "nul", "must not hold a NUL character"))
    if not found and not argv[0]:
        found.append(Violation("command[0]", "empty", "the program to run must be named"))
    return found


def _env(env: Mapping[str, str]) -> list[Violation]:
    if len(env) > MAX_ENV:
        return [Violation("env", "length", f"at most {MAX_ENV} variables")]
    found = []
    for name, value in env.items():
        where = f"env.{name}"
        if not isinstance(name, str) or not ENV_NAME.match(name):
            found.append(Violation(where, "pattern", "a name of letters, digits and _, not starting with a digit"))
        elif name.upper().startswith(RESERVED_ENV_PREFIXES):
            found.append(Violation(where, "reserved", f"names starting {', '.join(RESERVED_ENV_PREFIXES)} are "
                                                      "the scheduler's and the platform's own"))
        if not isinstance(value, str) or len(value) > MAX_ENV_VALUE_CHARS:
            found.append(Violation(where, "length", f"a value of at most {MAX_ENV_VALUE_CHARS} characters"))
        elif "\x00" in value:
            found.append(Violation(where, "nul", "must not hold a NUL character"))
    return found


def check(request: JobRequest, policy: JobPolicy, cluster_kind: ClusterKind, cluster_gpus: int) -> list[Violation]:
    """Every reason ``request`` may not run on a ``cluster_kind`` cluster of ``cluster_gpus`` GPUs in all under
    ``policy``: the request's own rules, then the policy's, then the kind's. Empty: it may."""
    found = validate(request)
    if request.privileged and not policy.allow_privileged:
        found.append(Violation("privileged", "not_allowed", "this tenant's policy does not allow privileged jobs"))
    found += _gpus(request, policy, cluster_gpus)
    if request.time_limit_s > policy.max_time_limit_s:
        found.append(Violation("time_limit_s", "policy", f"this tenant's policy allows at most "
                                                         f"{policy.max_time_limit_s} s"))
    if request.image is not None and policy.allowed_images and \
            not any(fnmatchcase(request.image, p) for p in policy.allowed_images):
        found.append(Violation("image", "not_allowed", "not among this tenant's allowed images: "
                                                       + ", ".join(policy.allowed_images)))
    return found + _kind(request, cluster_kind)


def _gpus(request: JobRequest, policy: JobPolicy, cluster_gpus: int) -> list[Violation]:
    if _range("tasks", request.tasks, 1, MAX_TASKS) or _range("gpus_per_task", request.gpus_per_task, 0,
                                                              MAX_GPUS_PER_TASK):
        return []   # already said
    found = []
    if policy.max_gpus_per_job is not None and request.gpus > policy.max_gpus_per_job:
        found.append(Violation("gpus_per_task", "policy", f"tasks × gpus_per_task is {request.gpus}; this tenant's "
                                                          f"policy allows {policy.max_gpus_per_job} GPUs a job"))
    if request.gpus > cluster_gpus:
        found.append(Violation("gpus_per_task", "capacity", f"tasks × gpus_per_task is {request.gpus}; the cluster "
                                                            f"has {cluster_gpus} GPUs in all"))
    return found


def _kind(request: JobRequest, kind: ClusterKind) -> list[Violation]:
    if kind == "slurm" and request.entrypoint is not None:
        return [Violation("entrypoint", "kind", "a Slurm cluster runs a command (an argv), not a shell line")]
    if kind == "kubernetes" and request.image is None:
        return [Violation("image", "required", "a Kubernetes cluster runs a container image")]
    if kind != "kubernetes" and request.image is not None:
        # Slurm and Ray run on the nodes' own userland: an image would be silently ignored.
        return [Violation("image", "kind", f"a {kind} cluster runs on its nodes' own system, not an image")]
    return []


def runtime_command(request: JobRequest) -> tuple[str, ...]:
    """The argv for ``JobSpec.command``: the command as given, or the entrypoint run by ``sh -c`` (a driver that
    takes one shell line, as Ray does, shell-quotes the argv back into one)."""
    if request.command is not None:
        return tuple(request.command)
    return ("sh", "-c", request.entrypoint or "")


# --- Lifecycle -----------------------------------------------------------------------------------------------

FINAL: frozenset[str] = TERMINAL | {"REJECTED"}
_ENDS = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "TIMEOUT"})
# Where each state may go. A scheduler's state is read by polling, so a read may skip states (a short job goes
# from PENDING to SUCCEEDED between two reads); a job that ends while its cancel is in flight keeps its own end.
MOVES: Mapping[str, frozenset[str]] = {
    "SUBMITTING": frozenset({"PENDING", "RUNNING", "REJECTED", "CANCELLING", "CANCELLED"}) | _ENDS,
    "PENDING": frozenset({"RUNNING", "CANCELLING"}) | _ENDS,
    "RUNNING": frozenset({"CANCELLING"}) | _ENDS,
    "CANCELLING": _ENDS,
    **{state: frozenset() for state in FINAL},
}
_ORDER = {"SUBMITTING": 0, "PENDING": 1, "RUNNING": 2, "CANCELLING": 3}


class IllegalTransition(ValueError):
    """A move the lifecycle does not have (out of a final state, or backwards)."""


@dataclass(frozen=True)
class Lifecycle:
    """A job's state, and why it is there (REJECTED's reason, the scheduler's message)."""

    state: str = "SUBMITTING"
    reason: str = ""

    @property
    def final(self) -> bool:
        return self.state in FINAL

    def to(self, target: str, reason: str = "") -> Lifecycle:
        """Move to ``target``. The state it is already in is a no-op (a redelivered event); any other move that
        ``MOVES`` lacks raises :class:`IllegalTransition`. REJECTED needs its reason."""
        if target == self.state:
            return self
        if target not in MOVES.get(self.state, frozenset()):
            raise IllegalTransition(f"a job cannot go from {self.state} to {target}")
        if target == "REJECTED" and not reason:
            raise ValueError("a rejected job keeps why it was rejected")
        return Lifecycle(target, reason)

    def requeued(self, reason: str) -> Lifecycle:
        """A RUNNING job put back in its queue because a node it ran on was lost (Slurm's ``JobRequeue``, a
        Kubernetes Job's pods made again): PENDING, saying why. The one move backwards, and only from RUNNING:
        ``to`` and ``observed`` never take it (a poll reading PENDING after RUNNING is a lagging read)."""
        if self.state != "RUNNING":
            raise IllegalTransition(f"only a running job is requeued, not a {self.state} one")
        return Lifecycle("PENDING", reason)

    def observed(self, seen: str, message: str = "") -> Lifecycle:
        """Take the scheduler's state read by a poll. A read behind what is known already (PENDING after
        RUNNING from a lagging read, RUNNING while a cancel is in flight) changes nothing; an end is taken."""
        if self.final or seen == self.state:
            return self
        if seen not in _ENDS and _ORDER.get(seen, -1) <= _ORDER.get(self.state, -1):
            return self
        return self.to(seen, message)
