"""A handle on one run: wait for its admission and its result (following handoffs)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runstream.engine.client.answers import AnswerTrimmed, forgotten
from runstream.engine.client.placed import Placed
from runstream.engine.config import wait_seconds
from runstream.engine.errors import (
    ResultTimeout,
    RunCancelled,
    RunExpired,
    RunFailed,
    RunNotFound,
    RunstreamError,
    run_failure,
)
from runstream.engine.flow.definition import HandedOff, settled_outcome
from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.engine.journal.records import ROUND_SEPARATOR, is_round
from runstream.engine.readmodel.describe import status_note
from runstream.engine.readmodel.lookups import addressed
from runstream.engine.readmodel.view import View
from runstream.projections.expiry import (
    create_rejection,
    expired_create,
    round_to_follow,
)
from runstream.projections.state import RunState, RunStatus, round_zero
from runstream.projections.step_entries import exhausted_text

# How long a create waits for its owner's answer before the read model is asked whether the
# run it names had expired (its tombstone answers then: _admission_answer).
EXPIRED_CHECK_S = 5.0
# How long a timed-out wait asks the read model for the run's status, when the tail passed
# none of the run's records (they lay before where it started): the timeout's "last seen".
LAST_SEEN_S = 2.0

if TYPE_CHECKING:
    from runstream.engine.client.client import Client


@dataclass
class RunHandle:
    """A created or attached run: wait for its admission and its result."""

    client: Client
    run_id: str
    flow: str | None
    partition: int | None
    request_offset: int
    request_id: str | None
    _from_offset: int | None = None
    # A create sent to a requests topic, and where it went: where the relay put it is looked
    # up first (its admission waited for ever when the relay refused it).
    _relayed: tuple[JournalRecord, Placed] | None = None
    _existed: bool = False  # the record at _from_offset made the run (an answer said so)

    @property
    def journal_offset(self) -> int | None:
        """The create's offset in the journal; None while a relayed create's is not known
        (the relay has not forwarded it yet: a wait finds it)."""
        return self.request_offset if self._relayed is None else None

    async def admitted(self, timeout: float | None = None) -> None:
        """Wait until the owner admitted the run; raises IdentityConflict or CreateRejected.
        `timeout`: seconds (None: no limit); InvalidInput unless finite and more than 0."""
        timeout = wait_seconds(timeout)
        try:
            await asyncio.wait_for(self._admission(), timeout)
        except TimeoutError:
            raise ResultTimeout(self.run_id, timeout or 0, await self._last_seen(),
                                waited_for="was not admitted") from None

    async def _admission(self) -> int:
        if self._from_offset is not None:
            return self._from_offset
        tail = self.client._tail
        partition = await self._partition()
        if self.request_id is None and is_round(self.run_id):
            # A later round is created by its predecessor's handoff, never by a request.
            self._from_offset = 0
            return self._from_offset
        if self.request_id is None:
            try:
                created = await self._checked(  # (the read model, then the tail)
                    tail.created(partition, 0, self.run_id), partition, self._reused)
            except AnswerTrimmed:  # (its record is gone: its settlement or state answers)
                await self.client.describe(self.run_id)  # (RunNotFound: it was rejected)
                self._from_offset = 0
                return self._from_offset
            if isinstance(created, ev.RunCreateRejected):
                raise create_rejection(self.run_id, created)
            created_by = ev.RunCreated | ev.RunForked
            if isinstance(created, created_by):
                self._from_offset, self._existed = created.request_offset, True
            else:
                self._from_offset = 0
            return self._from_offset
        if self._relayed is not None:
            # Until the relay's offset is found, request_offset is where the tail stood when
            # the request was sent: a wait cut short (a timeout) looks it up again, where
            # the next waited from there for ever when the relay had refused the request.
            record, placed = self._relayed  # (placed.offset is request_offset until found)
            self.request_offset = await self.client.relayed_offset(placed, record)
            self._relayed = None  # (request_offset is the request's own from here)
        try:
            answer = await self._admission_answer(partition)
        except AnswerTrimmed:  # (the journal's retention deleted it: the run's state answers)
            run = await self.client.describe(self.run_id)  # (RunExpired, RunNotFound)
            self._from_offset, self._existed = run.request_offset, True
            return self._from_offset
        if isinstance(answer, ev.RunCreateRejected):
            raise create_rejection(self.run_id, answer)
        assert isinstance(answer, ev.RunCreated)
        self._from_offset, self._existed = answer.request_offset, True
        return self._from_offset

    async def _admission_answer(self, partition: int) -> JournalRecord:
        """The owner's answer to our create. Every owner rejects a create naming a run that
        expired before it (reason `expired`), but the reducer keeps nothing of such a
        create: one that lands while no owner executes the partition (a rebalance) is
        answered by none, and its caller waited for ever. Unanswered after
        EXPIRED_CHECK_S, the read model's tombstone answers it as the owner would."""
        assert self.request_id is not None
        return await self._checked(self.client._tail.admission(
            partition, self.request_offset, self.request_id, self.run_id), partition,
            self._expired)

    def _expired(self, view: View) -> None:
        stone = view.tombstone(self.run_id) if view.run(self.run_id) is None else None
        if stone is not None and stone.expired_offset < self.request_offset:
            raise expired_create(stone)

    def _reused(self, view: View) -> JournalRecord | None:
        """A create of the run that repeated its partition's request id while no owner
        executed the partition is answered by none: the read model judges it as the owner
        would (projections.request_reuse), where an attached handle waited for ever."""
        found = view.reuse_rejection(self.run_id) if view.run(self.run_id) is None else None
        return None if found is None else found[1]

    async def _checked(self, answer: Awaitable[JournalRecord], partition: int,
                       check: Callable[[View], JournalRecord | None]) -> JournalRecord:
        """`answer`, unless `check` of the partition's read model, every EXPIRED_CHECK_S
        while it does not come, raises or answers first."""
        waiting = asyncio.ensure_future(answer)
        try:
            while True:
                done, _ = await asyncio.wait([waiting], timeout=EXPIRED_CHECK_S)
                if done:
                    return waiting.result()
                view = await (await self.client.read_model()).catch_up([partition])
                judged = check(view)
                if judged is not None:
                    return judged
        finally:
            waiting.cancel()

    async def result(self, timeout: float | None = None, *, follow: bool = False) -> Any:
        """The run's result; raises RunFailed, RunCancelled, or the admission error. A round
        that handed off returns HandedOff naming the next round; with `follow=True`, the
        lineage's last round's result instead. `timeout`: seconds (None: no limit), after
        which ResultTimeout; InvalidInput unless finite and more than 0."""
        timeout = wait_seconds(timeout)
        try:
            return await asyncio.wait_for(self._result(follow), timeout)
        except TimeoutError:
            raise ResultTimeout(self.run_id, timeout or 0, await self._last_seen()) from None

    async def _last_seen(self) -> str:
        """What a timeout says it saw last: the run's last record the tail passed, else its
        status in the read model (a run suspended before this client followed it, whose
        records lie before where the tail started), else "nothing yet"."""
        seen = self.client._tail.passed.last_type.get(self.run_id)
        if seen is not None:
            return seen
        try:
            run, owner = await asyncio.wait_for(self._described(), LAST_SEEN_S)
        except (RunstreamError, TimeoutError):
            return "nothing yet"
        note = status_note(run, owner=owner)  # (as `run status` words it)
        return f"{run.status.value}, {note}" if note else run.status.value

    async def _described(self) -> tuple[RunState, str | None]:
        """The run as the read model holds it (as Client.describe), and its partition's
        owner from the same catch-up (a run not admitted names it: "no worker has claimed"
        it was, when one had)."""
        view, run = await addressed(await self.client.read_model(), self.run_id)
        return run, view.partition(run.partition).owner_name

    async def _result(self, follow: bool) -> Any:
        if self.client.authority is not None:
            self.client.check_authority(await self.client.describe(self.run_id))
        handle: RunHandle = self
        while True:
            record, run = await handle._settlement()
            if run is None:
                assert record is not None  # (no state: the record says it all)
                outcome = handle._outcome(record)
            else:
                outcome = settled_outcome(run, handle.run_id,
                                          self.client.flow_named(handle.flow))
            if not follow or not isinstance(outcome, HandedOff):
                return outcome
            partition = await handle._partition()
            handle = RunHandle(self.client, run_id=await _round_to_follow(
                                   self.client, partition, outcome.run_id),
                               flow=_next_flow(handle.flow, record, run),
                               partition=partition, request_offset=0,
                               request_id=None, _from_offset=handle._from_offset)

    async def _settlement(self) -> tuple[JournalRecord | None, RunState | None]:
        """The record that settled the run, and, where the reducer may have made another
        outcome of it than the record says, the run's state that says which (else None);
        the state alone (record None) when the journal's retention deleted the record."""
        from_offset = await self._admission()
        partition = await self._partition()
        tail = self.client._tail
        # A handoff may have been cancelled (projections.transitions); a settlement after
        # run.timed-out is a failure, and a timeout failure meeting a cancel is the cancel
        # (projections.deadlines): the tail does not fold runs, the read model does. The
        # round itself, not its lineage's latest (which a lineage id names).
        exact = self.run_id if is_round(self.run_id) else f"{self.run_id}{ROUND_SEPARATOR}0"
        try:
            record = await tail.settlement(partition, from_offset, self.run_id,
                                           existed=self._existed)
        except AnswerTrimmed:
            view = await (await self.client.read_model()).catch_up([partition])
            run = view.run(round_zero(exact))
            if run is None:
                return None, await self.client.describe(exact)  # (RunExpired, RunNotFound)
            if run.status.is_terminal:  # (its settlement's record is gone: its state says)
                return None, run
            # (a previous round's handoff without its state, kept from an older store: this
            # round's own settlement is still to come, past what this view holds)
            record = await tail.settlement(partition, view.partition(partition).next_offset,
                                           self.run_id)
        if not isinstance(record, ev.RunHandedOff) and tail.settled_as_passed(
                partition, from_offset, self.run_id):
            return record, None
        try:
            return record, await self.client.describe(exact)
        except RunExpired:
            raise
        except RunNotFound:  # (an answer kept from before the run left: not the round id)
            if not self._existed:
                raise
            raise forgotten(self.run_id, partition, from_offset) from None

    def _outcome(self, record: JournalRecord) -> Any:
        if isinstance(record, ev.RunHandedOff):
            return HandedOff(record.next_run_id, record.round)
        if isinstance(record, ev.RunCompleted):
            flow = self.client.flow_named(self.flow)
            return flow.load_result(record.result_json) if flow else json.loads(record.result_json)
        if isinstance(record, ev.RunFailed):
            raise run_failure(self.run_id, record.error_type, record.error_message)
        if isinstance(record, ev.LineageExhausted):
            raise RunFailed(self.run_id, "LineageExhausted", exhausted_text(record))
        if isinstance(record, ev.RoundInvalid):
            raise RunFailed(self.run_id, "RoundInvalid", record.reason)
        assert isinstance(record, ev.RunCancelled)
        raise RunCancelled(self.run_id, record.reason)

    async def status(self) -> RunStatus:
        return await self.client.status(self.run_id)

    async def _partition(self) -> int:
        if self.partition is None:
            self.partition = await self.client.partition_of(self.run_id)
        return self.partition


def _next_flow(flow: str | None, handoff: JournalRecord | None, run: RunState | None
               ) -> str | None:
    """The flow whose result type loads the next round's result: the one the handoff names,
    else the round's own (None: unknown, the result stays JSON, as for a handle by id)."""
    named = handoff.flow if isinstance(handoff, ev.RunHandedOff) else ""
    return named or (run.flow if run is not None else flow)


async def _round_to_follow(client: Client, partition: int, named: str) -> str:
    """The round to follow after a handoff to `named` (projections.expiry.round_to_follow),
    as the read model holds the lineage now."""
    return round_to_follow(await (await client.read_model()).catch_up([partition]), named)
