"""An owner's answers to requests, and the start of run executions.

What to answer and whether a run starts is decided by projections.owner (one owner path with
the TestEnvironment); this module asks it for the worker (engine.worker.reactions carries
the answers out) and starts executions for the runs it says to start.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Any

from runstream.engine.errors import WorkerFatal
from runstream.engine.flow.context import RunReleased
from runstream.engine.flow.definition import Flow
from runstream.engine.worker.executor import RunExecution, now_ms
from runstream.engine.worker.ownership import Ownership
from runstream.engine.worker.run_protocols import ActivationOwner
from runstream.engine.worker.sweep import ClaimSweeps
from runstream.projections import owner
from runstream.projections.decide import plan_activation
from runstream.projections.reactions import Interrupt, Start
from runstream.projections.state import RunState
from runstream.projections.store import ProjectionStore

log = logging.getLogger("runstream.worker")

MAX_OWNER_NAMES = 1024


class Activator:
    """Answers a claim's requests and starts each run at most once: it holds the runs
    executing here (the worker's `executions`)."""

    def __init__(self, owner: ActivationOwner) -> None:
        self.owner = owner
        self.executions: dict[str, RunExecution] = {}  # bounded by the owned runs
        # Names of the owners whose claims we applied, for evidence: the latest 1024.
        self._owner_names: OrderedDict[str, str] = OrderedDict()
        self.sweeps = ClaimSweeps(owner)  # the claim-time sweeps, one per partition

    def owner_seen(self, source_id: str, name: str) -> None:
        self._owner_names[source_id] = name
        self._owner_names.move_to_end(source_id)
        if len(self._owner_names) > MAX_OWNER_NAMES:
            self._owner_names.popitem(last=False)

    def owner_name(self, source_id: str) -> str:
        return self._owner_names.get(source_id, f"source {source_id[:8]}")

    def activate_partition(self, own: Ownership, store: ProjectionStore) -> None:
        """Right after our claim: re-send the outbox, then answer what is unanswered and
        start what should run, in a sweep that yields the loop (engine.worker.sweep)."""
        self.owner.outbox.resend(own)
        self.owner.timers.reset()
        self.owner.retention.reset()
        self.sweeps.start(own, store, self._answer_requests)

    def _answer_requests(self, own: Ownership, run: RunState) -> None:
        """A run holding requests at the claim (projections.owner.swept_requests)."""
        reactions = self.owner.reactions
        reactions.act(own, owner.swept_requests(reactions.view(own), run))

    def start(self, own: Ownership, run: RunState, *, woken: bool = False) -> None:
        """Start `run` as projections.owner.start says (failed, cancelled, its limits fixed
        first, left pending without its flow), unless it executes here already."""
        reactions = self.owner.reactions
        reactions.act(own, owner.start(reactions.view(own), run, woken=woken))

    def launch(self, own: Ownership, start: Start) -> None:
        """Execute `start.run` unless it executes here already. `woken`: its wait just ended
        (a wake applied), so an execution still unwinding from that suspension restarts it."""
        run = start.run
        executions = self.executions
        existing = executions.get(run.run_id)
        if existing is not None:
            if start.woken and existing.suspending:
                existing.restart = True
            return
        flow = self.owner.flows[run.flow]  # (projections.owner.start: registered)
        plan = plan_activation(run, self.owner_name, now_ms())
        execution = RunExecution(self.owner, own, run, plan)
        if start.activated:
            execution.activated = True  # in its run.created (projections.owner)
        elif self.slot_free(run.flow):
            # Activate in this turn of the loop, so that the activation shares a produce
            # request with the decisions before it. The others are activated when they get
            # their slot.
            execution.activate()
        executions[run.run_id] = execution
        own.run_ids.add(run.run_id)
        execution.task = asyncio.create_task(self._execute(execution, flow))
        # Also forgotten when the task ends without ever running: a task cancelled before
        # its first step (the partition lost later in the poll that started it) never
        # enters _execute, and a stale entry would keep the run from starting again here.
        execution.task.add_done_callback(lambda _: self._forget(execution))

    def slot_free(self, flow: str) -> bool:
        """A slot will be free for a run of `flow` started now: the executions started so
        far hold or wait for fewer than all of them, and the flow has no max_concurrency
        (its limit may hold the run back)."""
        registered = self.owner.flows.get(flow)
        # (a handler parked in the sticky cache holds no slot, as the TestEnvironment's
        # suspended ones hold none)
        started = len(self.executions) - len(self.owner.sticky)
        return (registered is not None and registered.max_concurrency is None
                and started < self.owner.concurrency)

    def left_behind(self, run_id: str) -> None:
        """The execution of `run_id` ignored its cancellation (engine.worker.claims)."""
        execution = self.executions.get(run_id)
        if execution is not None:
            self._forget(execution)

    def interrupt(self, interrupt: Interrupt) -> None:
        """The run's deadline passed: cancel its handler executing here, once (abandon: its
        grace passed too; projections.deadlines)."""
        execution = self.executions.get(interrupt.run.run_id)
        if execution is None:
            return
        # A handler parked on its wait is not woken to clean up: the owner fails its
        # suspended run at once, and it unwinds from the cache without side effects.
        parked = self.owner.sticky.drop(execution.run.run_id) if interrupt.abandon else (
            execution.parked is not None)
        execution.interrupt(None if parked else execution.task, abandon=interrupt.abandon)
        if interrupt.abandon:
            # Its grace is over: the owner settles the run; the handler journals nothing
            # more and gives back its slot (a task that ignores cancellation runs on,
            # forgotten).
            if not parked:
                log.warning("run %s: its handler did not stop within its timeout grace: "
                            "abandoned", execution.run.run_id)
            self._forget(execution)
            execution.release_slot()

    async def _execute(self, execution: RunExecution, flow: Flow[Any, Any]) -> None:
        run_id = execution.run.run_id
        try:
            await execution.execute(flow)
        except (asyncio.CancelledError, RunReleased):
            pass
        except WorkerFatal as exc:
            log.error("run %s stopped: %s", run_id, exc)
        except Exception:
            log.exception("run %s: unexpected executor error", run_id)
        finally:
            self._forget(execution)
            self._runnable_again(execution)

    def _forget(self, execution: RunExecution) -> None:
        """`execution` ended: the run may be started again (idempotent)."""
        run_id = execution.run.run_id
        current = self.executions.get(run_id)
        if current is not None and current is not execution:
            return  # a newer execution of the run (e.g. _runnable_again's) holds it
        self.executions.pop(run_id, None)
        execution.ownership.run_ids.discard(run_id)

    def _runnable_again(self, execution: RunExecution) -> None:
        """A wake applied while this execution was still unwinding from its suspension found
        it here and did not start the run: start it now."""
        own = execution.ownership
        run = self.owner.current_run(execution.run.run_id)
        if (execution.restart and run is not None and own.executing
                and not self.owner.stopping):
            self.owner.reactions.react(own, run)
