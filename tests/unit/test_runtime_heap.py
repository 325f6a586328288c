"""A started service's heap is settled: what it made to start is out of every later full collection's way."""
from __future__ import annotations

import subprocess
import sys
import textwrap


def test_after_settling_a_full_collection_walks_only_what_was_made_since():
    # a fresh interpreter: freezing is for the life of the process
    code = textwrap.dedent("""
        import gc
        from shared.runtime import settle_heap
        made_to_start = [[i] for i in range(50_000)]        # long-lived, like a service's contracts and schemas
        settle_heap()
        made_since = [[i] for i in range(10)]
        gc.collect()
        walked = {id(o) for o in gc.get_objects(generation=2)}
        assert gc.get_freeze_count() >= len(made_to_start), gc.get_freeze_count()
        assert not any(id(o) in walked for o in made_to_start[:100] + [made_to_start])
        assert all(id(o) in walked for o in made_since + [made_since])
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
