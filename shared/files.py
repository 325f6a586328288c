"""Files a process keeps on a node's disk (records, tables, documents): replaced whole or not at all, so a reader
or a restart after a crash finds the previous file or the new one, never a part."""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def replace_atomically(path: Path, write: Callable[[IO[Any]], None], *, binary: bool = False, durable: bool = True,
                       mode: int | None = None) -> None:
    """Write ``path`` anew through ``write`` (given the open temporary file, text or ``binary``), then put it in
    place with one rename; on any error the temporary file is removed and the old file stays. ``durable``: the
    data reach the disk before the rename. ``mode``: the file's permissions (else the temporary file's 0600).
    Blocking; raises OSError."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if binary else "w") as f:
            write(f)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
