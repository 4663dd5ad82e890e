"""A create whose request id its partition applied before, naming a run that does not exist:
answered, so that its sender is not left waiting. Pure: no I/O, no clock.

Request ids are deduplicated per partition (projections.reducer: a repeated id is a
duplicate, whatever run it names). A create naming a run that does not exist, with an id the
partition holds, is therefore the repeat of another request: another run's (a producer that
reused an id), or an earlier send of this very create that was rejected (a rejected run is
dropped). Either way no run is made, and before this nothing answered it: a plain producer
waited for its answer for ever, and so did a client attached to the run. Its owner rejects
it (reason `request-id-reused`). The reducer ignores a rejection of a run it does not hold,
as it ignores an expired run's (projections.owner.answer_expired): the rejection is there
for readers, in the journal and in the partition's history (projections.writes keeps a
record naming no run there). One no owner answered (sent while none executed the
partition: no inbox holds it for the next owner's sweep) its readers judge from the
repeat's own verdict, as the owner would have (`reuse_answer`).

Not answered: a create reusing an id for a run that does exist (the run is there to
query). A parent's spawn is failed either way, at the repeat, unless the run is that
parent's child (projections.requests.reused_spawn): no answer here reaches its parent."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import islice

from runstream.engine.errors import RunNotFound
from runstream.engine.journal import events as ev
from runstream.projections.decide import rejection_why
from runstream.projections.replay import record_of
from runstream.projections.state import RunState, Verdict
from runstream.projections.values import HistoryEntry

REQUEST_ID_REUSED = "request-id-reused"

CreateRequest = ev.RunCreateRequested | ev.RunSignalWithStartRequested


def is_reuse_answer(record: ev.JournalRecord) -> bool:
    """Whether `record` is such a rejection: it answers no request of the run that used its
    request id first (a reader keying admissions by request id alone must not take it)."""
    return isinstance(record, ev.RunCreateRejected) and record.reason == REQUEST_ID_REUSED


def reused_key(request_id: str, offset: int) -> str:
    """The owner's decided key for its answer to the reused id at `offset`: the id alone is
    the answer to the request that used it first (it may be in flight still)."""
    return f"reused@{offset}:{request_id}"


def unmade_run(record: CreateRequest, partition: int, offset: int) -> RunState:
    """The run the create names, as far as the answer about it needs (ids, partition): what
    the rejection is written from. Never stored."""
    env = record.envelope
    return RunState(run_id=env.run_id, lineage_id=env.lineage_id, partition=partition,
                    flow=record.flow, payload_json="null", request_id=env.request_id or "",
                    request_offset=offset, created_at_ms=env.timestamp_ms,
                    updated_at_ms=env.timestamp_ms)


def reused_rejection(request_id: str, partition: int) -> dict[str, str]:
    """The run.create-rejected body answering it (CreateRejected's detail is
    requested_value)."""
    return {"request_id": request_id, "reason": REQUEST_ID_REUSED, "field": "request_id",
            "existing_value": f"applied before on partition {partition}",
            "requested_value": (
                f"request id {request_id!r} was applied before on partition {partition}, to "
                f"another request (another run's, or an earlier send of this create, whose "
                f"answer stands): no run was made; give each create its own request id")}


# Partition-history items read past a repeated create for its answer: the owner answers it
# as it applies it, so the answer follows within the records other writers sent meanwhile.
ANSWER_SCAN = 256
# The latest repeats naming a run whose answers are looked for (a later repeat of another
# kind, as a signal reusing an id, names the run too).
REPEATS_SCANNED = 8
_CREATES = frozenset({ev.RunCreateRequested.TYPE, ev.RunSignalWithStartRequested.TYPE})


def reuse_answer(run_id: str, repeats: Sequence[int],
                 history_from: Callable[[int], Iterable[HistoryEntry]]
                 ) -> tuple[HistoryEntry, ev.RunCreateRejected] | None:
    """What answers the latest create of `run_id`, a run that does not exist, that repeated
    its partition's request id: the owner's rejection, or, when none follows it (none is
    written while no owner executes the partition: a rebalance, every worker stopped), the
    one it would write, judged as the owner judges it, from the repeat's own verdict.
    `repeats`: the offsets of the partition's duplicates naming the run, oldest first;
    `history_from(offset)`: the partition's history from there (where a record naming no
    run the partition holds is kept: projections.writes)."""
    for offset in reversed(repeats[-REPEATS_SCANNED:]):
        items = iter(history_from(offset))
        repeat = next(items, None)
        if (repeat is None or repeat.offset != offset or repeat.type not in _CREATES
                or repeat.verdict is not Verdict.duplicate
                or (repeat.record is None and repeat.raw is None)):
            continue  # (a repeated signal, say: it names the run too)
        written = _written(run_id, items)
        return (repeat, _as_owner_would(repeat, record_of(repeat))) if written is None else written
    return None


def _written(run_id: str, items: Iterable[HistoryEntry]
             ) -> tuple[HistoryEntry, ev.RunCreateRejected] | None:
    """The owner's rejection of a create of `run_id` among the ANSWER_SCAN `items` after it
    (ignored: a fenced one is a deposed owner's, which no live reader takes)."""
    for item in islice(items, ANSWER_SCAN):
        if (item.type != ev.RunCreateRejected.TYPE or item.verdict is not Verdict.ignored
                or (item.record is None and item.raw is None)):
            continue
        record = record_of(item)
        if (isinstance(record, ev.RunCreateRejected) and is_reuse_answer(record)
                and record.envelope.run_id == run_id):
            return item, record
    return None


def reused_not_found(run_id: str, answer: HistoryEntry, record: ev.RunCreateRejected
                     ) -> RunNotFound:
    """What a query about `run_id` raises once `reuse_answer` found its rejection (a
    Client's, engine.readmodel.lookups, and the TestEnvironment's alike)."""
    return RunNotFound(run_id, rejected=rejection_why(record),
                       records=f"runstream partition history {answer.partition}")


def _as_owner_would(repeat: HistoryEntry, request: ev.JournalRecord) -> ev.RunCreateRejected:
    env = request.envelope
    body = reused_rejection(env.request_id or "", repeat.partition)
    del body["request_id"]
    return ev.RunCreateRejected(envelope=ev.Envelope(
        type=ev.RunCreateRejected.TYPE, run_id=env.run_id, lineage_id=env.lineage_id,
        request_id=env.request_id, timestamp_ms=repeat.timestamp_ms), **body)
