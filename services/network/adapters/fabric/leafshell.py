"""Running a command on a Linux leaf: in its network namespace here (``ip -n``/``ip netns exec``); over SSH or the
switch's agent on a remote leaf, with the same commands."""
from __future__ import annotations

import asyncio

from .base import FabricRefused

TIMEOUT_S = 10.0


async def run(leaf: str, ns: str, argv: list[str], ok: tuple[int, ...] | None = (0,)) -> str:
    """Run ``argv`` (``ip``, or a program) in the leaf's namespace; its stdout. An exit status not in ``ok`` (None:
    any will do) raises FabricRefused with the leaf's words."""
    full = [argv[0], "-n", ns, *argv[1:]] if argv[0] == "ip" else ["ip", "netns", "exec", ns, *argv]
    what = " ".join(argv) if argv[0] == "ip" else "the ARP probe"
    try:
        proc = await asyncio.create_subprocess_exec(*full, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
    except (OSError, TimeoutError) as exc:
        raise FabricRefused(f"leaf {leaf} did not answer `{what}`: {exc}") from None
    if ok is not None and proc.returncode not in ok:
        raise FabricRefused(f"leaf {leaf} refused `{what}`: {err.decode(errors='replace').strip()[:300]}")
    return out.decode(errors="replace")
