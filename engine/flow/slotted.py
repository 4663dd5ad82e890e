"""The execution slot a run's handler holds while it runs (a mixin of the handler runner).

A worker's admission and the TestEnvironment's alike: a flow at its max_concurrency waits
for a slot, and journals, once for that wait, why (`run status` shows it).
"""

from __future__ import annotations

from typing import Any

from runstream.engine.flow.definition import Flow
from runstream.engine.flow.port import Slots
from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.projections.decide import FLOW_CONCURRENCY_LIMIT
from runstream.projections.state import RunState


class SlotTaking:
    """Mixed into HandlerRunner, which provides the run, `send` and `flow_named`."""

    run: RunState
    _holds_slot: bool = False

    def send(self, cls: type[JournalRecord], **body: Any) -> None:
        raise NotImplementedError

    def flow_named(self, name: str) -> Flow[Any, Any] | None:
        raise NotImplementedError

    def _slots(self) -> tuple[Slots, str]:
        """The slots this run's execution takes one of, and where they are (evidence); a
        runner that takes none (the dry run's sandbox) never asks."""
        raise NotImplementedError

    async def take_slot(self) -> None:
        """A slot before the handler runs (again); a flow at its max_concurrency journals,
        once for this wait, why the run waits (`run status` shows it)."""
        slots, where = self._slots()
        flow = self.run.flow
        if slots.at_limit(flow):
            registered = self.flow_named(flow)
            limit = registered.max_concurrency if registered is not None else None
            message = (f"waits for a slot: flow {flow!r} has max_concurrency={limit} and "
                       f"{slots.held(flow)} of its runs execute on {where}")
            self.send(ev.EvidenceRecorded, kind=FLOW_CONCURRENCY_LIMIT, message=message,
                      attributes={"flow": flow, "max_concurrency": str(limit)})
        await slots.acquire(flow)
        self._holds_slot = True

    def release_slot(self) -> None:
        if self._holds_slot:
            self._holds_slot = False
            self._slots()[0].release(self.run.flow)
