"""The user's contexts (gateway URL, API key, the last bearer token), like kubectl's.

The file is ``$TESSERA_CONFIG``, else ``$XDG_CONFIG_HOME/tessera/config.json`` (default
``~/.config/tessera/config.json``): {"current": name, "contexts": {name: {url, api_key, token,
token_expires_at}}}. It holds secrets: written 0600 in a 0700 directory, replaced atomically.
``TESSERA_URL`` + ``TESSERA_API_KEY`` give a context without any file (scripts, CI)."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from cli.errors import USAGE, CliError

ENV_CONTEXT = "(environment)"


def config_path() -> Path:
    explicit = os.environ.get("TESSERA_CONFIG")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "tessera" / "config.json"


def load(path: Path | None = None) -> dict:
    """The config document; an empty one when there is no file."""
    path = path or config_path()
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {"current": None, "contexts": {}}
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot read {path}: {exc}") from exc
    doc.setdefault("contexts", {})
    doc.setdefault("current", None)
    return doc


def save(doc: dict, path: Path | None = None) -> Path:
    """Write ``doc`` with mode 0600 (its directory 0700) through a temporary file and a rename, so a reader
    never sees half a file and the secret is never readable by others, even for a moment."""
    path = path or config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.parent.name == "tessera":      # our own directory: tighten it even if it existed
        os.chmod(path.parent, 0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True)
        f.write("\n")
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
    return path


@dataclass
class Context:
    """Where and who: one named context, or the environment's (``saved`` False: nothing to write back)."""
    name: str
    url: str
    api_key: str
    token: str | None = None
    token_expires_at: float = 0.0
    saved: bool = True
    extra: dict = field(default_factory=dict)

    def remember_token(self, token: str, expires_at: float) -> None:
        """Keep a fresh token for the next command (only for a context of the config file)."""
        self.token, self.token_expires_at = token, expires_at
        if not self.saved:
            return
        doc = load()
        entry = doc["contexts"].get(self.name)
        if entry is not None:
            entry.update(token=token, token_expires_at=expires_at)
            save(doc)


def resolve(name: str | None) -> Context:
    """The context a command runs in: ``--context NAME`` when given; else TESSERA_URL + TESSERA_API_KEY when
    both are set; else the config's current context. CliError (usage) when there is none."""
    if name is None and os.environ.get("TESSERA_URL") and os.environ.get("TESSERA_API_KEY"):
        return Context(ENV_CONTEXT, os.environ["TESSERA_URL"].rstrip("/"), os.environ["TESSERA_API_KEY"], saved=False)
    doc = load()
    name = name or doc.get("current")
    if not name:
        raise CliError("not logged in: run `tessera login URL --api-key KEY` "
                       "(or set TESSERA_URL and TESSERA_API_KEY)", USAGE)
    entry = doc["contexts"].get(name)
    if entry is None:
        raise CliError(f"no context named {name!r} (tessera context list)", USAGE)
    return Context(name, entry["url"].rstrip("/"), entry["api_key"], entry.get("token"),
                   float(entry.get("token_expires_at") or 0))
