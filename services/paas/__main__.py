from shared.runtime import serve

from .bootstrap import build

if __name__ == "__main__":
    serve(build, "paas")
