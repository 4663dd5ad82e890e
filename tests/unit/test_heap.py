"""engine.worker.heap: the CLI worker's collector settings. Each test runs in a child process:
freezing and thresholds are process-wide, and the suite's own process keeps its defaults."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _child(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_settle_collects_then_freezes_the_survivors_and_raises_the_thresholds() -> None:
    out = _child("""
        import gc, weakref
        from runstream.engine.worker import heap

        class Node: pass
        kept, lost = Node(), Node()
        lost.me = lost  # a cycle only the collector frees
        gone = weakref.ref(lost)
        del lost
        took = heap.settle()
        assert gone() is None, "the cycle was frozen, not collected"
        assert gc.get_freeze_count() > 0 and took >= 0
        assert gc.get_threshold() == heap.THRESHOLDS, gc.get_threshold()
        print("ok")
    """)
    assert out == "ok"


def test_freeze_young_frees_young_garbage_and_freezes_what_start_up_made_since() -> None:
    out = _child("""
        import gc, weakref
        from runstream.engine.worker import heap

        heap.settle()
        frozen = gc.get_freeze_count()

        class Node: pass
        made = [Node() for _ in range(1000)]  # the clients and projection of a start-up
        lost = Node()
        lost.me = lost
        gone = weakref.ref(lost)
        del lost
        heap.freeze_young()
        assert gone() is None, "young garbage was frozen"
        assert gc.get_freeze_count() >= frozen + len(made), (frozen, gc.get_freeze_count())
        print("ok")
    """)
    assert out == "ok"


def test_freeze_once_started_waits_for_the_worker_to_start() -> None:
    out = _child("""
        import asyncio, gc
        from runstream.engine.worker import heap

        async def main():
            started = asyncio.Event()
            task = asyncio.create_task(heap.freeze_once_started(started))
            await asyncio.sleep(0.05)
            assert not task.done() and gc.get_freeze_count() == 0
            started.set()
            took = await task
            assert took >= 0 and gc.get_freeze_count() > 0

        asyncio.run(main())
        print("ok")
    """)
    assert out == "ok"
