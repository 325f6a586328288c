import asyncio

from .bootstrap import build

if __name__ == "__main__":
    asyncio.run(build().run_forever())
