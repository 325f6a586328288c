"""``python -m services.gateway``: run the gateway process (settings from the environment)."""
from shared.runtime import serve

from .bootstrap import build

if __name__ == "__main__":
    serve(build, "gateway")
