"""The TestEnvironment's updates and signals: Client.update and Client.signal on the virtual
clock, through the same reducer, owner and validator code as a worker's (projections.updates,
engine.flow.validation), and the same judgement of a repeated request id."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from runstream.engine.errors import SignalRefused, UpdateRefused
from runstream.engine.flow.definition import dump_json
from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import check_run_id
from runstream.engine.testing.inputs import check_request
from runstream.engine.testing.log import envelope
from runstream.projections.expiry import expired_error
from runstream.projections.memory import MemoryProjection
from runstream.projections.replay import update_outcome
from runstream.projections.requests import describe_refusal
from runstream.projections.state import RunState, Tombstone, Verdict, round_zero
from runstream.projections.updates import (
    answer_of,
    carried_past,
    carrying_round,
    expired_reuse_text,
    expired_round_asked,
    lineage_rounds,
    outcome_offset,
    refusal_text,
    reused_request_text,
)


class EnvUpdates:
    """Mixed into TestEnvironment."""

    projection: MemoryProjection

    def _request(self, cls: type[JournalRecord], run_id: str, *,
                 request_id: str | None = None, **body: Any) -> Verdict:
        raise NotImplementedError

    async def _drive(self, done: Callable[[], bool], *, until_ms: int | None = None,
                     passing: bool = False) -> None:
        raise NotImplementedError

    # (engine.testing.queries: annotated, not stubbed, so they do not shadow that mixin's)
    _exact: Callable[[str], RunState]
    describe: Callable[[str], RunState]

    async def signal(self, run_id: str, name: str, payload: Any = None, *,
                     request_id: str | None = None) -> None:
        """Send signal `name`; raises SignalRefused when the run cannot take it (or its
        request id was another request's: no run took it), RunNotFound (RunExpired) when
        there is none, as a Client does. The same request id again is the signal it sent
        (its payload is not compared, as a Client's and as Temporal's request id)."""
        check_run_id(run_id)
        check_request(ev.RunSignalSent, run_id, {"name": name, "payload_json": "null"})
        self._exact(run_id)
        outcome = self._request(ev.RunSignalSent, run_id, request_id=request_id, name=name,
                                payload_json=dump_json(payload))
        if outcome == Verdict.refused:
            run = self.describe(run_id)  # (a lineage id: its latest round)
            record = ev.RunSignalSent(envelope=envelope(ev.RunSignalSent, run_id, None, 0),
                                      name=name)
            raise SignalRefused(run_id, name, describe_refusal(run, record))
        if outcome is Verdict.duplicate and self._round_asked(
                self.describe(run_id).lineage_id, request_id or "", ev.RunSignalSent) is None:
            # (its id was another request's on the partition: no run took this signal; or a
            # round that expired since took it: which, cannot be told, as a Client's)
            stone = self._expired_asked(self.describe(run_id), request_id or "")
            raise SignalRefused(run_id, name, reused_request_text(request_id or "", "signal")
                                if stone is None else expired_reuse_text(request_id or "", stone))

    async def update(self, run_id: str, name: str, payload: Any = None, *,
                     request_id: str | None = None) -> Any:
        """As Client.update, driving the environment until the update is answered (or its
        run settles without answering it: UpdateRefused)."""
        repeat, request_id = request_id is not None, request_id or uuid.uuid4().hex
        body = {"name": name, "payload_json": dump_json(payload)}
        verdict = self._request(ev.RunUpdateRequested, run_id, request_id=request_id, **body)
        # (`~0`: round 0; a refusal names the id the caller gave, as a Client's)
        named, zero, run_id = run_id, run_id != round_zero(run_id), round_zero(run_id)
        run = self.projection.runs.get(self._addressed(run_id))
        taken_by = None if run is None else self._round_asked(run.lineage_id, request_id)
        if run is not None and taken_by is None and repeat and verdict is not Verdict.applied:
            taken_by = self._taken_past_expiry(run, request_id)  # (RunExpired: its answer went)
        if zero and verdict is Verdict.refused:  # (round 0 had handed off: not sent)
            if repeat and taken_by is not None:
                verdict = Verdict.duplicate  # (a round took it: that update, as a Client's)
            else:
                run = self.projection.runs.get(run_id)  # (round 0's state says why)
        if verdict is Verdict.refused or run is None:
            if run is None:
                self._exact(run_id)  # (RunExpired or RunNotFound, as a Client's request)
            asked = ev.RunUpdateRequested(
                envelope=envelope(ev.RunUpdateRequested, run_id, request_id, 0), name=name)
            raise UpdateRefused(named, name, describe_refusal(
                run, asked, self.projection.store.tombstone(run_id)))
        if verdict is Verdict.duplicate and taken_by is None:
            raise UpdateRefused(named, name, reused_request_text(request_id))
        # (the round that took it: it may have handed off since, the request following it)
        holder = [taken_by or run.run_id]
        await self._drive(lambda: self._answered(holder, request_id))
        # (an outcome names the round that gave it, or ended without: as a Client's
        # engine.client.updates._outcome; the lineage may live on past it)
        run = self.projection.runs[holder[0]]
        outcome = self._outcome(run, request_id)
        if outcome is None:
            raise UpdateRefused(run.run_id, name, refusal_text(run))
        return answer_of(run.run_id, name, outcome)

    def _addressed(self, run_id: str) -> str:
        """The round a request naming `run_id` reaches: a lineage's id names its latest."""
        return self.projection.store.latest_round(run_id) or run_id

    def _round_asked(self, lineage_id: str, request_id: str,
                     cls: type[ev.RunUpdateRequested | ev.RunSignalSent] = ev.RunUpdateRequested,
                     ) -> str | None:
        """The round of the lineage that took update `request_id` (or a request of `cls`),
        None when no round did, as a Client finds it (engine.client.updates._round_asked).
        Round 0 was taken for it: past two handoffs the request, sent to the latest round,
        was never found following round 1, and the update was reported refused although
        the run answered it."""
        for run in lineage_rounds(self.projection.runs.get, lineage_id,
                                  self.projection.store.latest_round(lineage_id)):
            for item in self.projection.history.get(run.run_id, []):
                if (item.verdict is Verdict.applied and isinstance(item.record, cls)
                        and item.record.envelope.request_id == request_id):
                    return run.run_id
        return None

    def _expired_asked(self, latest: RunState, request_id: str) -> Tombstone | None:
        """The tombstone of the round of `latest`'s lineage that took request `request_id`,
        when it expired since, as a Client finds it (engine.client.updates._expired_asked)."""
        store = self.projection.store
        return expired_round_asked(store.run, store.tombstone, latest.lineage_id,
                                   latest.run_id,
                                   store.request_offset(latest.partition, request_id))

    def _taken_past_expiry(self, latest: RunState, request_id: str) -> str | None:
        """As a Client's (engine.client.updates._taken_past_expiry)."""
        stone = self._expired_asked(latest, request_id)
        if stone is None:
            return None
        held = carried_past(self.projection.store.run, stone, request_id, latest.run_id)
        if held is None:
            raise expired_error(stone)
        return held.run_id

    def _answered(self, holder: list[str], request_id: str) -> bool:
        """Whether the update has its outcome, or its run settled without one (following it
        into the next round when a handoff carried it)."""
        while True:
            run = self.projection.runs[holder[0]]
            if self._outcome(run, request_id) is not None:
                return True
            if not run.status.is_terminal:
                return False
            following = carrying_round(run, request_id, self.projection.runs.get)
            if following is None:
                return True
            holder[0] = following.run_id  # (and look there now: it may be answered)

    def _outcome(self, run: RunState, request_id: str
                 ) -> ev.UpdateRejected | ev.UpdateCompleted | None:
        offset = outcome_offset(run, request_id)
        items = self.projection.history.get(run.run_id, [])
        return update_outcome([i for i in items if offset is None or i.offset == offset],
                              request_id)
