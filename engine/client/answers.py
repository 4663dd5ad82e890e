"""What answers a client's waits: the record types, and finding an answer in the read model.

The client's tail (engine.client.tail) answers waiters with the decisions it passes; an
answer passed before anyone waited for it, and evicted from the tail's cache since, is found
here among the run's records in the read model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runstream.engine.errors import RunExpired
from runstream.engine.journal import DecodeError, JournalRecord, Skimmed, decode
from runstream.engine.journal import events as ev
from runstream.engine.readmodel.view import View
from runstream.projections.expiry import expired_error
from runstream.projections.follow import NOT_ACCEPTED
from runstream.projections.request_reuse import is_reuse_answer
from runstream.projections.state import Verdict

# What ends a round (a handoff too: its round is completed, the lineage goes on).
TERMINAL_TYPES = frozenset({ev.RunCompleted.TYPE, ev.RunFailed.TYPE, ev.RunCancelled.TYPE,
                            ev.RunHandedOff.TYPE, ev.LineageExhausted.TYPE,
                            ev.RoundInvalid.TYPE})
# (a schedule change's answer too: created, updated, deleted, fired, or rejected)
ADMISSION_TYPES = frozenset({ev.RunCreated.TYPE, ev.RunCreateRejected.TYPE,
                             ev.ScheduleCreated.TYPE, ev.ScheduleUpdated.TYPE,
                             ev.ScheduleDeleted.TYPE, ev.ScheduleFired.TYPE,
                             ev.ScheduleChangeRejected.TYPE})
REQUEST_TYPES = frozenset({ev.RunCreateRequested.TYPE, ev.RunSignalSent.TYPE,
                           ev.RunCancelRequested.TYPE, ev.RunResumeRequested.TYPE,
                           ev.RunWakeRequested.TYPE, ev.RunForkRequested.TYPE,
                           ev.ScheduleChangeRequested.TYPE,
                           ev.RunSignalWithStartRequested.TYPE, ev.RunUpdateRequested.TYPE})
# What makes a run exist: a create request admitted, or a fork request admitted.
CREATION_TYPES = frozenset({ev.RunCreated.TYPE, ev.RunForked.TYPE})
CREATED_ANSWERS = CREATION_TYPES | {ev.RunCreateRejected.TYPE}
# The decisions the tail answers with, decoded in full; of every other record it decodes
# the envelope alone.
ANSWER_TYPES = ADMISSION_TYPES | TERMINAL_TYPES | CREATION_TYPES


@dataclass(frozen=True, slots=True)
class Answer:
    """What a waiter is given: the decision that answers it and where it stands."""

    partition: int
    offset: int
    record: JournalRecord


def lacks_bytes(view: View, run_id: str, from_offset: int) -> bool:
    """Whether some of the run's history items at or past `from_offset` hold no record
    bytes (a read model that bootstrapped from a worker's snapshot has none below it)."""
    return any(item.raw is None and item.offset >= from_offset
               for item in view.history(run_id))


class AnswerTrimmed(Exception):
    """The run's creation or settlement is in the read model's history, but the journal's
    retention deleted its record (a read model from a snapshot has no bytes below it, and
    the broker has none to fetch): the run's state says what it was
    (engine.client.handle)."""


def answer_in(view: View, key: str, run_id: str, partition: int,
              from_offset: int) -> Answer | None:
    """The answer to `key` among the run's records in the read model, if any; AnswerTrimmed
    when the run's creation or settlement is there with its record deleted."""
    kind, _, ident = key.partition(":")
    if kind == "seen":
        return request_in(view, ident, run_id, partition, from_offset)
    items = (view.history(run_id) if run_id
             else view.partition_history_from(partition, from_offset))  # (a schedule's)
    trimmed = False
    for item in items:
        # (a create naming an expired run is rejected by a decision the reducer ignores:
        # its run is gone; the tail takes it all the same)
        taken = (item.verdict is Verdict.applied
                 or (kind == "req" and item.verdict not in NOT_ACCEPTED))
        if not taken or item.offset < from_offset:
            continue
        # (a rejected create too: engine.client.tail.JournalTail.created judges it)
        wanted = ((kind == "req" and item.type in ADMISSION_TYPES)
                  or (kind == "created" and item.type in CREATED_ANSWERS)
                  or (kind == "end" and item.type in TERMINAL_TYPES))
        if not wanted:
            continue
        if item.raw is None:  # (its bytes were fetched before this: the broker has none)
            # (not the previous round's handoff, kept in this round's history with the
            # state it made: it does not end this round)
            # (a create's answer too: its handle waited for ever for a record gone)
            trimmed = trimmed or (kind in ("req", "created", "end") and bool(run_id)
                                  and item.seed is None)
            continue
        record = decode(item.raw)
        if kind != "req" and record.envelope.run_id != run_id:
            continue  # the previous round's handoff, kept in this round's history too
        if kind != "req" or (record.envelope.request_id == ident
                             and not is_reuse_answer(record)):
            return Answer(item.partition, item.offset, record)
    if trimmed:
        raise AnswerTrimmed(run_id)
    if kind == "created" and run_id and view.run(run_id) is None:
        return _reuse_answer(view, run_id, from_offset)
    return None


def _reuse_answer(view: View, run_id: str, from_offset: int) -> Answer | None:
    """The rejection of a create of `run_id` that made no run, its request id its
    partition's before: kept in the partition's history (projections.request_reuse), not
    the run's, so an attach after it waited for ever."""
    found = view.reuse_rejection(run_id)
    if found is None or found[0].offset < from_offset:
        return None
    return Answer(found[0].partition, found[0].offset, found[1])


def raise_if_expired(view: View, key: str, run_id: str, from_offset: int) -> None:
    """RunExpired when the answer waited for was passed before the run expired, so only
    its tombstone is left: its creation or settlement, or the answer to a create request
    journaled before the expiry (an unanswered one keeps a run from expiring). A create
    sent after the expiry waits for the owner's rejection (reason `expired`)."""
    kind = key.partition(":")[0]
    stone = view.tombstone(run_id) if view.run(run_id) is None else None
    if stone is None or kind == "seen":
        return
    if kind != "req" or from_offset < stone.expired_offset:
        raise expired_error(stone)


def raise_if_forgotten(view: View, run_id: str, partition: int, from_offset: int) -> None:
    """RunExpired when the read model applied the record at `from_offset`, which made the
    run (its create request, or its creation), and holds nothing of the run: it settled,
    expired, and its tombstone went after the tombstone retention, all before this wait
    began; the tail follows on from past it, so the wait would last for ever. Something is
    always left of a run whose answer is still to come: the run (a create request makes a
    pending run, the request in its inbox), its tombstone, or its history (a rejection)."""
    if (view.partition(partition).next_offset <= from_offset or view.run(run_id) is not None
            or view.tombstone(run_id) is not None
            or any(item.offset >= from_offset for item in view.history(run_id))):
        return
    raise forgotten(run_id, partition, from_offset)


def forgotten(run_id: str, partition: int, from_offset: int) -> RunExpired:
    """What answers a wait for a run that existed past `from_offset` and left nothing."""
    return RunExpired(run_id, f"expired (or was rejected), and its tombstone went too after "
                              f"the tombstone retention: the projections keep nothing of it "
                              f"past partition {partition} offset {from_offset}")


def request_in(view: View, request_id: str, run_id: str, partition: int,
                from_offset: int) -> Answer | None:
    """The first record of request `request_id` at or past `from_offset`, whatever its
    verdict (a request naming a lineage is kept in its latest round's history)."""
    names = dict.fromkeys((run_id, view.addressed(run_id))) if run_id else ("",)
    for name in names:
        items = (view.history(name) if name
                 else view.partition_history_from(partition, from_offset))  # (a schedule's)
        for item in items:
            if (item.partition != partition or item.offset < from_offset or item.raw is None
                    or item.type not in REQUEST_TYPES):
                continue
            record = decode(item.raw)
            if record.envelope.request_id == request_id:
                return Answer(item.partition, item.offset, record)
    return None


def placed_request(record: JournalRecord | Skimmed, value: bytes,
                   headers: Sequence[tuple[str, bytes]]) -> JournalRecord | None:
    """A relayed request the tail passed, decoded in full; None when bytes broken inside
    its body (read only to its envelope so far) make it a dead letter to every other
    reader, and here too: it was never placed."""
    if not isinstance(record, Skimmed):
        return record
    try:
        return decode(value, headers)
    except DecodeError:
        return None
