"""Schedules in the TestEnvironment, on its virtual clock: the same change requests a Client
sends, answered and fired by the same owner code a worker runs (projections.schedule_owner).
Mixed into engine.testing.env.TestEnvironment."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from runstream.engine.config import Duration
from runstream.engine.errors import ScheduleNotFound, ScheduleRejected
from runstream.engine.flow.definition import Flow
from runstream.engine.flow.schedule_spec import (
    NOT_GIVEN,
    backfill_fields,
    check_schedule_id,
    create_fields,
    spec_fields,
)
from runstream.engine.journal import events as ev
from runstream.engine.journal.records import request_envelope
from runstream.engine.testing.log import MemoryLog
from runstream.projections import schedule_owner
from runstream.projections.expiry import schedule_now
from runstream.projections.memory import MemoryProjection
from runstream.projections.partitioning import run_partition
from runstream.projections.reactions import OwnerView, Reaction
from runstream.projections.schedule_state import ScheduleState


class Schedules:
    """create_schedule, update, pause, unpause, delete, trigger, backfill, describe, list."""

    partitions: int
    clock_ms: int
    log: MemoryLog
    projection: MemoryProjection

    def _view(self) -> OwnerView:
        raise NotImplementedError

    def _act(self, reactions: Iterable[Reaction], *, launch: bool = False) -> None:
        raise NotImplementedError

    async def create_schedule(
        self, schedule_id: str, flow: Flow[Any, Any] | str, payload: Any = None, *,
        cron: str | None = None, every: Duration | None = None,
        offset: Duration | None = None, timezone: str = "UTC",
        overlap: str = "skip", catchup_window: Duration = timedelta(minutes=1),
        jitter: Duration | None = None, paused: bool = False,
        run_timeout: Duration | None = None,
    ) -> None:
        """As Client.create_schedule, on the virtual clock."""
        self._change("create", schedule_id, create_fields(
            flow, payload, cron=cron, every=every, offset=offset, timezone=timezone,
            overlap=overlap,
            catchup_window=catchup_window, jitter=jitter, paused=paused,
            run_timeout=run_timeout))

    async def update_schedule(self, schedule_id: str, **given: Any) -> None:
        """Change what is given (flow, payload, cron, every, timezone, overlap, ...)."""
        flow, payload = given.pop("flow", None), given.pop("payload", NOT_GIVEN)
        self._change("update", schedule_id, spec_fields(flow, payload, **given))

    async def pause_schedule(self, schedule_id: str, *, note: str = "") -> None:
        self._change("pause", schedule_id, {"note": note or None})

    async def unpause_schedule(self, schedule_id: str) -> None:
        self._change("unpause", schedule_id, {})

    async def delete_schedule(self, schedule_id: str) -> None:
        self._change("delete", schedule_id, {})

    async def trigger_schedule(self, schedule_id: str) -> str:
        """Run it now; returns the fired run's id."""
        request_id = self._change("trigger", schedule_id, {})
        return f"{schedule_id}@trigger/{request_id}"

    async def backfill_schedule(self, schedule_id: str, start: datetime | int,
                                end: datetime | int) -> None:
        self._change("backfill", schedule_id, backfill_fields(start, end))

    def describe_schedule(self, schedule_id: str) -> ScheduleState:
        schedule = self.projection.store.schedule(schedule_id)
        if schedule is None or not schedule.exists:
            raise ScheduleNotFound(schedule_id)
        store = self.projection.store
        return schedule_now(store, schedule)

    def list_schedules(self) -> list[ScheduleState]:
        store = self.projection.store
        found = [store.schedule(sid) for p in range(self.partitions)
                 for sid in store.schedule_ids(p)]
        return [schedule_now(store, s)
                for s in sorted((s for s in found if s is not None and s.exists),
                                key=lambda s: s.schedule_id)]  # (as a Client's)

    def _change(self, action: str, schedule_id: str, fields: dict[str, Any]) -> str:
        check_schedule_id(schedule_id)
        request_id = uuid.uuid4().hex
        envelope = request_envelope(ev.ScheduleChangeRequested.TYPE, "",
                                    request_id=request_id, now_ms=self.clock_ms,
                                    lineage_id=schedule_id)
        record = ev.ScheduleChangeRequested(envelope=envelope, schedule_id=schedule_id,
                                            action=action, **fields)
        partition = run_partition(schedule_id, self.partitions)
        self.log.append(partition, record)  # (folded, and answered by the owner, at once)
        for item in reversed(self.projection.partition_history.get(partition, [])):
            answer = item.record
            if answer is not None and answer.envelope.request_id == request_id:
                if isinstance(answer, ev.ScheduleChangeRejected):
                    raise ScheduleRejected(schedule_id, action, answer.reason)
                break
        return request_id

    def _claim_schedules(self) -> None:
        """A new owner's claim: every schedule's changes and buffered fire."""
        store = self.projection.store
        for partition in range(self.partitions):
            for schedule_id in store.schedule_ids(partition):
                schedule = store.schedule(schedule_id)
                if schedule is not None:
                    self._act(schedule_owner.on_claim(self._view(), schedule, self.clock_ms))

    def _fire_due_schedules(self) -> None:
        store = self.projection.store
        for partition in range(self.partitions):
            for _, schedule_id in store.due_schedules(partition, self.clock_ms, 1 << 30):
                schedule = store.schedule(schedule_id)
                if schedule is not None:
                    self._act(schedule_owner.on_due(self._view(), schedule, self.clock_ms))
