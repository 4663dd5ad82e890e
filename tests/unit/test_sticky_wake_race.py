"""A wake applied while a suspending handler still waits for its run.suspended to be
acknowledged (engine.worker.executor.RunExecution._suspend, at its barrier): the sticky
cache has nothing parked to wake, so the owner's Start finds the execution suspending and
marks it to restart. The handler then parked all the same and waited for a wake already
spent: the run hung until the cache evicted it. Now it unwinds, and the run starts again.

The worker's own RunExecution, StickyCache and Activator, driven in one process; what the
owner around them does (its producer's acknowledgement, its projection) is played by the
test. The broker's side of suspensions and the sticky cache: tests/integration/test_waits.py.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from runstream.engine.flow.port import Suspend
from runstream.engine.worker.activation import Activator
from runstream.engine.worker.admission import Admission
from runstream.engine.worker.executor import RunExecution
from runstream.engine.worker.ownership import Ownership, OwnershipState
from runstream.engine.worker.sticky import StickyCache
from runstream.projections.decide import Activation
from runstream.projections.reactions import Start
from runstream.projections.state import RunState, RunStatus, Wait


async def test_a_wake_during_the_suspension_unwinds_the_handler_instead_of_parking() -> None:
    acks: list[asyncio.Future[None]] = []

    def enqueue(own: Any, run: Any, cls: Any, **body: Any) -> asyncio.Future[None]:
        acks.append(asyncio.get_running_loop().create_future())
        return acks[-1]

    async def confirm(own: Any) -> None:
        return None

    owner: Any = SimpleNamespace(
        enqueue=enqueue, claims=SimpleNamespace(confirm=confirm), admission=Admission(4),
        flows={"f": SimpleNamespace(max_concurrency=None)}, concurrency=4,
        current_run=lambda run_id: None, stopping=False)
    activator = Activator(owner)
    owner.activator = activator
    owner.sticky = StickyCache(16, forget=activator.left_behind)
    own = Ownership(partition=0, claim_id="c", state=OwnershipState.ready)
    run = RunState(run_id="r", lineage_id="r", partition=0, flow="f", payload_json="null",
                   request_id="q", request_offset=0, created_at_ms=0, updated_at_ms=0,
                   status=RunStatus.running, admitted=True, activations=1)
    execution = RunExecution(owner, own, run, Activation("new", "first", None, None))
    execution.activated = True
    activator.executions["r"] = execution
    suspending = asyncio.create_task(execution.suspend(Wait(kind="timer", position=0,
                                                            due_ms=1)))
    await asyncio.sleep(0.01)  # run.suspended sent, its acknowledgement not come yet
    assert execution.suspending and execution.parked is None
    # Applied meanwhile: run.suspended and the timer that ends the wait. The owner's
    # reaction: Resume, else (nothing parked) Start(woken).
    assert not owner.sticky.wake("r", None)
    activator.launch(own, Start(run, woken=True))
    assert execution.restart
    acks[0].set_result(None)
    done, _ = await asyncio.wait({suspending}, timeout=1)
    assert done and isinstance(suspending.exception(), Suspend)
    assert execution.parked is None and len(owner.sticky) == 0
