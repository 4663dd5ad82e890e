"""One activation of a run's handler inside the TestEnvironment: its journal port."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from runstream.engine.flow.context import FlowContext, RunReleased, Suspend
from runstream.engine.flow.definition import Flow
from runstream.engine.flow.port import Slots, suspension, takeover_of
from runstream.engine.flow.runner import Dropped, HandlerRunner
from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.projections.decide import plan_activation
from runstream.projections.state import JournalEntry, RunState, Verdict, Wait

if TYPE_CHECKING:
    from runstream.engine.testing.env import TestEnvironment


class TestExecution(HandlerRunner):
    """Records go straight into the environment's log and are folded at once, so the
    barrier is only a yield and a confirmation is the verdict just given."""

    __test__ = False

    def __init__(self, env: TestEnvironment, run: RunState, *, activated: bool = False
                 ) -> None:
        """`activated`: its first activation rode in its run.created (projections.owner)."""
        self.env = env
        self.run = run
        self.activated = activated
        self.settled = False
        self.crashed = False
        self.task: asyncio.Task[None] | None = None
        self._ctx: FlowContext | None = None
        self._verdict = Verdict.applied

    def _send(self, cls: type[JournalRecord], **body: Any) -> None:
        self.ensure_active()
        position = body.get("position", body.get("final_step_position"))
        if self.env.crash_point(self.run.run_id, position):
            self.crashed = True
            raise Dropped(f"crash injected at position {position} of run {self.run.run_id}")
        # Checked against the send limit as a worker's committer checks it (EncodeError):
        # a record a worker cannot send fails a test too.
        self._verdict = self.env.log.send(self.run_state(), cls, dict(body))

    async def _barrier(self) -> None:
        await asyncio.sleep(0)  # written already; let other handlers run

    async def _send_confirmed(self, cls: type[JournalRecord], **body: Any) -> None:
        self.send(cls, **body)
        if self._verdict is not Verdict.applied:
            raise RunReleased(f"{cls.TYPE} was {self._verdict.value}")

    def _ensure_active(self) -> None:
        if self.abandoned:
            raise RunReleased("its deadline and grace passed: the owner failed it")
        if self.crashed:
            raise RunReleased("the handler is dropped (suspended, or a crash injected)")

    def now_ms(self) -> int:
        return self.env.clock_ms

    @property
    def durable_backoff_after_ms(self) -> int:
        return self.env.durable_backoff_after_ms

    def run_state(self) -> RunState:
        return self.env._exact(self.run.run_id)  # (the run itself, not its lineage's latest round)

    def entry(self, position: int) -> JournalEntry | None:
        return self.env.projection.store.entry(self.run.run_id, position)

    def flow_named(self, name: str) -> Flow[Any, Any] | None:
        return self.env.flows.get(name)

    def journal(self) -> tuple[JournalEntry, ...]:
        return self.env.journal(self.run.run_id)

    async def _suspend(self, wait: Wait) -> JournalEntry | None:
        self.settled = True
        self.send(ev.RunSuspended, **suspension(wait))
        self.crashed = True  # like a worker's: the unwinding handler journals nothing more
        raise Suspend(wait)

    async def execute(self, flow: Flow[Any, Any]) -> None:
        """As a worker's execution: a slot first (the environment's admission, with its
        flows' max_concurrency), then the activation and the handler."""
        await self.take_slot()
        try:
            if self.run_state().status.is_terminal:
                return  # settled while it waited for a slot (a cancel): its handler never runs
            await self._activated(flow)
        finally:
            self.release_slot()

    def _slots(self) -> tuple[Slots, str]:
        return self.env.admission, "the test environment"

    async def _activated(self, flow: Flow[Any, Any]) -> None:
        run = self.run_state()
        plan = plan_activation(run, lambda source: f"source {source[:8]}")
        self.takeover = takeover_of(plan.mode, plan.evidence)
        try:
            if not self.activated:
                self.send(ev.RunActivated, mode=plan.mode, activation=run.activations + 1,
                          evidence=plan.evidence, previous_owner=plan.previous_owner,
                          previous_epoch=plan.previous_epoch)
            await self.run_handler(flow)
        except (RunReleased, Dropped):
            return
