"""A Client's schedule calls (mixed into engine.client.client.Client): each change is a
schedule.change-requested sent to the schedule's partition (directly, or through the relay),
answered by the partition's owner; the call returns its answer, or raises ScheduleRejected
with the owner's reason. Reads come from the read model."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from runstream.engine.client.tail import JournalTail
from runstream.engine.config import Duration
from runstream.engine.errors import (
    ResultTimeout,
    ScheduleNotFound,
    ScheduleRejected,
)
from runstream.engine.flow.definition import Flow
from runstream.engine.flow.schedule_spec import (
    NOT_GIVEN,
    backfill_fields,
    check_schedule_id,
    create_fields,
    spec_fields,
)
from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.engine.journal.records import request_envelope
from runstream.engine.journal.timetext import epoch_ms
from runstream.engine.readmodel.model import ReadModel
from runstream.projections.expiry import schedule_now
from runstream.projections.schedule_state import ScheduleState

ANSWER_TIMEOUT_S = 30.0  # how long a change waits for its owner's answer


class ScheduleCalls:
    """create_schedule, update, pause, unpause, delete, trigger, backfill, describe, list."""

    authority: frozenset[str] | None
    _tail: JournalTail

    async def read_model(self) -> ReadModel:
        raise NotImplementedError

    async def partition_of(self, run_id: str) -> int:
        raise NotImplementedError

    async def _place(self, record: JournalRecord,
                     extra_headers: list[tuple[str, bytes]] | None = None) -> Any:
        raise NotImplementedError

    async def _journal_offset(self, placed: Any, record: JournalRecord) -> int:
        raise NotImplementedError

    async def create_schedule(
        self, schedule_id: str, flow: Flow[Any, Any] | str, payload: Any = None, *,
        cron: str | None = None, every: Duration | None = None,
        offset: Duration | None = None, timezone: str = "UTC",
        overlap: str = "skip", catchup_window: Duration = timedelta(minutes=1),
        jitter: Duration | None = None, paused: bool = False,
        run_timeout: Duration | None = None,
    ) -> None:
        """A schedule firing `flow` with `payload` at each instant of `cron` (five fields,
        read in `timezone`) or `every` (aligned to the epoch, plus `offset`). `overlap`:
        skip, buffer_one, allow_all or cancel_other; fires missed while no worker ran are
        made up within `catchup_window` (a window under 10 s counts as 10 s). Exactly one
        of `cron` and `every` (InvalidInput, nothing sent, for neither or both). Raises
        ScheduleRejected (the owner's reason) when it cannot be."""
        ceiling = None if self.authority is None else sorted(self.authority)
        await self._change("create", schedule_id, {**create_fields(
            flow, payload, cron=cron, every=every, offset=offset, timezone=timezone,
            overlap=overlap,
            catchup_window=catchup_window, jitter=jitter, paused=paused,
            run_timeout=run_timeout), "ceiling": ceiling})

    async def update_schedule(self, schedule_id: str, **given: Any) -> None:
        """Change what is given (flow, payload, cron, every, timezone, overlap,
        catchup_window, jitter, run_timeout, paused, note); the next fire is recomputed."""
        flow, payload = given.pop("flow", None), given.pop("payload", NOT_GIVEN)
        await self._change("update", schedule_id, spec_fields(flow, payload, **given))

    async def pause_schedule(self, schedule_id: str, *, note: str = "") -> None:
        await self._change("pause", schedule_id, {"note": note or None})

    async def unpause_schedule(self, schedule_id: str) -> None:
        await self._change("unpause", schedule_id, {})

    async def delete_schedule(self, schedule_id: str) -> None:
        await self._change("delete", schedule_id, {})

    async def trigger_schedule(self, schedule_id: str) -> str:
        """Fire it now (whatever its overlap policy); the fired run's id."""
        answer = await self._change("trigger", schedule_id, {})
        assert isinstance(answer, ev.ScheduleFired)
        return answer.run_id

    async def backfill_schedule(self, schedule_id: str, start: datetime | int,
                                end: datetime | int) -> None:
        """Fire the instants in (start, end] the schedule did not fire itself."""
        await self._change("backfill", schedule_id, backfill_fields(start, end))

    async def describe_schedule(self, schedule_id: str) -> ScheduleState:
        """The schedule; its recent runs' statuses as their runs stand now (`expired` once
        retention removed them: schedule_state.with_run_statuses)."""
        model = await self.read_model()
        view = await model.catch_up()  # (its runs live on every partition)
        schedule = view.schedule(schedule_id)
        if schedule is None or not schedule.exists:
            raise ScheduleNotFound(schedule_id)
        return schedule_now(view, schedule)

    async def list_schedules(self) -> list[ScheduleState]:
        model = await self.read_model()
        view = await model.catch_up()
        found = [view.schedule(sid) for p in range(model.partitions)
                 for sid in view.schedule_ids(p)]
        return [schedule_now(view, s)
                for s in sorted((s for s in found if s is not None and s.exists),
                                key=lambda s: s.schedule_id)]

    async def _change(self, action: str, schedule_id: str, fields: dict[str, Any]
                      ) -> JournalRecord:
        check_schedule_id(schedule_id)
        request_id = uuid.uuid4().hex
        envelope = request_envelope(ev.ScheduleChangeRequested.TYPE, "",
                                    request_id=request_id,
                                    now_ms=epoch_ms(datetime.now(UTC)),
                                    lineage_id=schedule_id)
        record = ev.ScheduleChangeRequested(envelope=envelope, schedule_id=schedule_id,
                                            action=action, **fields)
        placed = await self._place(record)
        offset = await self._journal_offset(placed, record)
        try:
            answer = await asyncio.wait_for(
                self._tail.admission(placed.partition, offset, request_id, ""),
                ANSWER_TIMEOUT_S)
        except TimeoutError:
            # (the change stands: a caller who sent it again, told only of an error, had
            # it applied twice once a worker came, a trigger firing twice)
            raise ResultTimeout(schedule_id, ANSWER_TIMEOUT_S, subject=f"schedule {schedule_id}",
                                waited_for=f"had no answer to its {action} (is a worker up?)",
                                note=f"the {action} is in the journal and applies when a "
                                "worker runs: do not send it again") from None
        if isinstance(answer, ev.ScheduleChangeRejected):
            raise ScheduleRejected(schedule_id, action, answer.reason)
        return answer
