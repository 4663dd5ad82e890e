"""The worker: consumer-group member, projection owner, run executor.

`Worker` is imported on first use (PEP 562), as in `engine`: a module that needs one of the
worker's small parts (the dead-letter headers, the read-back rule) does not load the whole
worker, its metrics and its tracing with it. The CLI's start-up pays for that otherwise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runstream.engine.worker.worker import Worker

__all__ = ["Worker"]


def __getattr__(name: str) -> Any:
    if name != "Worker":
        raise AttributeError(f"module 'runstream.engine.worker' has no attribute {name!r}")
    from runstream.engine.worker.worker import Worker

    globals()["Worker"] = Worker  # later lookups skip this function
    return Worker
