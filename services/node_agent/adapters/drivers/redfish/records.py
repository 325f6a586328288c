"""The redfish driver's instance records: one JSON file per allocation in the state directory, written
atomically, so a restarted node-agent still knows what its server runs (the BMC knows nothing of allocations).

A record is made before the first Redfish call of a provisioning ("provisioning") and completed when the server
phoned home ("ready"); a failed provisioning removes it after its compensation ran.
"""
from __future__ import annotations

import json
import uuid
from pathlib import Path

from shared.files import replace_atomically


def instance_id(allocation_id: uuid.UUID) -> str:
    return f"bm-{allocation_id}"


class Records:
    """Blocking file operations (small files; called from the event loop as the libvirt driver's JSON is)."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)

    def _path(self, allocation_id: uuid.UUID) -> Path:
        return self.directory / f"{instance_id(allocation_id)}.json"

    def get(self, allocation_id: uuid.UUID) -> dict | None:
        try:
            return json.loads(self._path(allocation_id).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            # a torn or unreadable record still means the server may run the allocation: keep it visible
            return {"allocation_id": str(allocation_id), "instance_id": instance_id(allocation_id),
                    "status": "unreadable", "slots": []}

    def all(self) -> list[dict]:
        if not self.directory.is_dir():
            return []
        found = []
        for path in sorted(self.directory.glob("bm-*.json")):
            try:
                allocation = uuid.UUID(path.stem.removeprefix("bm-"))
            except ValueError:
                continue
            record = self.get(allocation)
            if record is not None:
                found.append(record)
        return found

    def save(self, record: dict) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self._path(uuid.UUID(record["allocation_id"]))
        replace_atomically(path, lambda f: json.dump(record, f))

    def remove(self, allocation_id: uuid.UUID) -> None:
        self._path(allocation_id).unlink(missing_ok=True)
