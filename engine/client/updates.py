"""A Client's updates (mixed into engine.client.client.Client): `client.update(run_id,
name, payload)` sends a run.update-requested and returns the handler's reply, read from
the journal through the read model as result() is (projections.updates)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from runstream.engine.config import wait_seconds
from runstream.engine.errors import (
    ResultTimeout,
    UpdateRefused,
)
from runstream.engine.flow.definition import dump_json
from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import (
    check_name,
    check_payload,
    check_request_id,
    check_run_id,
)
from runstream.engine.journal.records import request_envelope
from runstream.engine.readmodel.model import ReadModel
from runstream.engine.readmodel.view import View
from runstream.projections.expiry import expired_error
from runstream.projections.replay import update_outcome
from runstream.projections.requests import describe_refusal
from runstream.projections.state import RunState, Tombstone, Verdict
from runstream.projections.updates import (
    answer_of,
    carried_past,
    carrying_round,
    expired_round_asked,
    lineage_rounds,
    outcome_offset,
    refusal_text,
    reused_request_text,
)

POLL_S = 0.05


class UpdateRequests:
    """update()."""

    async def read_model(self) -> ReadModel:
        raise NotImplementedError

    async def _request(self, record: JournalRecord) -> Any:
        raise NotImplementedError

    async def update(self, run_id: str, name: str, payload: Any = None, *,
                     request_id: str | None = None, timeout: float | None = None) -> Any:
        """Ask run `run_id` for update `name` and return the handler's reply. Raises
        UpdateRejected (its validator or its handler rejected it), UpdateRefused (the run
        has ended, or ended without answering it, or holds as many updates and signals as
        it keeps), RunNotFound (RunExpired), ResultTimeout after `timeout` seconds. The same
        `request_id` again is the same update: its first outcome. InvalidInput, nothing
        sent, for a bad id, name or payload, or a `timeout` not finite and more than 0."""
        timeout = wait_seconds(timeout)
        check_run_id(run_id)
        check_name("update", name)
        if request_id is not None:
            check_request_id(request_id)
        payload_json = check_payload(f"the payload of update {name!r}", dump_json(payload))
        repeat, request_id = request_id is not None, request_id or uuid.uuid4().hex
        answer = await self._request(ev.RunUpdateRequested(
            envelope=request_envelope(ev.RunUpdateRequested.TYPE, run_id,
                                      request_id=request_id, now_ms=int(time.time() * 1000)),
            name=name, payload_json=payload_json))
        if answer.verdict is Verdict.refused:
            # `<lineage>~0` once it handed off is refused unsent; a repeat of an update a
            # round of the lineage took is that update, wherever it was sent (as the
            # lineage's id or another round's gets it)
            taken = (await self._round_asked(answer.run.lineage_id, answer.partition, request_id)
                     or await self._taken_past_expiry(answer.run.lineage_id, answer.partition,
                                                      request_id)
                     if repeat and answer.offset < 0 and answer.run is not None else None)
            if taken is None:
                raise UpdateRefused(run_id, name, describe_refusal(answer.run, answer.record))
            return await self._outcome(taken, answer.partition, request_id, name, timeout)
        lineage = answer.run.lineage_id if answer.run is not None else run_id
        # The round that took the update (the read model's latest round may be a later one,
        # which never answers it: a handoff after the reply).
        asked = await self._round_asked(lineage, answer.partition, request_id)
        if answer.verdict is Verdict.duplicate and asked is None:
            asked = await self._taken_past_expiry(lineage, answer.partition, request_id)
        if answer.verdict is Verdict.duplicate and asked is None:
            raise UpdateRefused(run_id, name, reused_request_text(request_id))
        target = asked or (answer.run.run_id if answer.run is not None else run_id)
        return await self._outcome(target, answer.partition, request_id, name, timeout)

    async def _round_asked(self, lineage_id: str, partition: int, request_id: str,
                           record_type: str = ev.RunUpdateRequested.TYPE) -> str | None:
        """The round of the lineage that took request `request_id`, an update (or another
        `record_type`: a signal), None when no round did."""
        view = await (await self.read_model()).catch_up([partition])
        for run in lineage_rounds(view.run, lineage_id, view.latest_round(lineage_id)):
            item = view.request_item(run.run_id, request_id)
            if (item is not None and item.verdict is Verdict.applied
                    and item.type == record_type):
                return run.run_id
        return None

    async def _expired_asked(self, lineage_id: str, partition: int, request_id: str
                             ) -> tuple[View, Tombstone | None]:
        """The tombstone of the round of the lineage that took request `request_id`, when
        it expired alone since (projections.updates.expired_round_asked: its history went
        with it, so _round_asked finds no round), and the view it was read from."""
        view = await (await self.read_model()).catch_up([partition])
        return view, expired_round_asked(view.run, view.tombstone, lineage_id,
                                         view.latest_round(lineage_id),
                                         view.request_applied_at(partition, request_id))

    async def _taken_past_expiry(self, lineage_id: str, partition: int, request_id: str
                                 ) -> str | None:
        """The round an update taken by a round that expired since is answered in (its
        handoff carried it there); RunExpired when its outcome went with that round; None
        when no round of the lineage took it."""
        view, stone = await self._expired_asked(lineage_id, partition, request_id)
        if stone is None:
            return None
        held = carried_past(view.run, stone, request_id, view.latest_round(lineage_id))
        if held is None:
            raise expired_error(stone)
        return held.run_id

    async def _outcome(self, run_id: str, partition: int, request_id: str, name: str,
                       timeout: float | None) -> Any:
        timeout = wait_seconds(timeout)  # (update() refused it before sending)
        deadline = None if timeout is None else time.monotonic() + timeout
        first = True
        horizon = -1  # the newest outcome offset the run's index held at the last look
        while True:
            model = await self.read_model()
            view = await model.catch_up([partition])
            run = view.run(run_id)
            if run is None:
                stone = view.expired(run_id)
                raise UpdateRefused(run_id, name, "no such run") if stone is None else (
                    expired_error(stone))
            # (outcomes the index took and dropped between two looks may hold the answer:
            # the history then, else a busy run's caller waited for ever)
            rolled = bool(run.update_outcomes) and run.update_outcomes[0].offset > horizon
            found = await self._found(model, view, run, partition, request_id,
                                      scan=first or run.status.is_terminal or rolled)
            horizon = max((o.offset for o in run.update_outcomes), default=horizon)
            if found is not None:
                return answer_of(run_id, name, found)
            if run.status.is_terminal:
                next_round = carrying_round(run, request_id, view.run)
                if next_round is None:
                    raise UpdateRefused(run_id, name, refusal_text(run))
                run_id = next_round.run_id  # (carried by a handoff: answered there)
            if deadline is not None and time.monotonic() > deadline:
                raise ResultTimeout(run_id, timeout or 0, run.status.value,
                                    subject=f"update {name!r} of run {run_id}",
                                    waited_for="was not answered")
            first = False
            await asyncio.sleep(POLL_S)

    async def _found(self, model: ReadModel, view: View, run: RunState, partition: int,
                     request_id: str, *, scan: bool
                     ) -> ev.UpdateRejected | ev.UpdateCompleted | None:
        """The update's outcome record: by the run's outcome index, or (`scan`: an outcome
        older than the index keeps) from the run's history."""
        offset = outcome_offset(run, request_id)
        if offset is None and not scan:
            return None
        await model.complete(view, run_ids=[run.run_id])
        if offset is not None:  # (one point lookup)
            item = view.history_entry(run.run_id, partition, offset)
            return update_outcome([] if item is None else [item], request_id)
        return update_outcome(view.history(run.run_id), request_id)
