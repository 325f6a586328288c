import asyncio
import sys

from .bootstrap import build
from .config import ConfigError

if __name__ == "__main__":
    try:
        runtime = build()
    except ConfigError as exc:
        sys.exit(f"node_agent: cannot start: {exc}")
    asyncio.run(runtime.run_forever())
