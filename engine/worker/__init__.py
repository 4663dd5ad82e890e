"""The worker: consumer-group member, projection owner, run executor, and the requests relay.

`worker` (Worker) wires the parts: ownership and claims, admission and activation, the
reactions to applied records, the executor and committer, read-back, timers and sweeps,
the outbox, forks, dead letters, the relay, upkeep, the watchdog, supervision and shutdown.
Each helper takes a narrow protocol (`partition_protocols`, `run_protocols`,
`helper_protocols`), never the Worker itself; what follows an applied record is
`projections.owner`'s to decide, and `reactions` carries it out.

`Worker` is imported on first use (PEP 562), as in `runstream`: a module that needs one of
the worker's small parts (the dead-letter headers, the read-back rule) does not load the
whole worker, its metrics and its tracing with it. The CLI's start-up pays for that otherwise.

May import: `engine.readmodel`, `engine.flow`, `engine.kafka`, `engine.observability`,
`projections`, `engine.journal`, `engine.errors`, `engine.config`; not the client, time
travel, ops or any face above them.
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
