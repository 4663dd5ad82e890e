"""The one place that builds request and decision envelopes, and decides a run's lineage.

Every record on the journal carries an Envelope. A request (a client's, the outbox's, the
TestEnvironment's) names a run, a request id and the time; its `lineage_id` is the run's
lineage (`lineage_of`: the Kafka key every round of the lineage shares). A decision (an
owner's) adds the owner's epoch and source, and its sequence once the committer stamps it.
Building them here keeps the worker, the client and the TestEnvironment writing the same
records. `too_large_to_send` is the send limit as the worker's committer measures it (the
encoded value), for an owner that has no committer (the TestEnvironment).
"""

from __future__ import annotations

from runstream.engine.journal.codec import encode
from runstream.engine.journal.codec_errors import EncodeError
from runstream.engine.journal.events import Envelope, JournalRecord
from runstream.engine.journal.record_size import MAX_SENT_RECORD_BYTES

ROUND_SEPARATOR = "~"  # round n > 0 of lineage L is the run `L~n`


def lineage_of(run_id: str) -> str:
    """The lineage a run id belongs to: the Kafka key all its rounds share. Round n > 0 of
    lineage L is `L~n`, so only a trailing `~<digits>` is a round's: a child a later round
    spawns (`L~1@4.0`, `L~1-kid`) is a lineage of its own, keyed by its whole id, and so are
    its rounds (`L~1@4.0~2` is round 2 of `L~1@4.0`)."""
    head, separator, tail = run_id.rpartition(ROUND_SEPARATOR)
    if separator and tail.isdigit() and tail.isascii():
        return head
    return run_id


def is_round(run_id: str) -> bool:
    """Whether `run_id` names a lineage's round n > 0 (`<lineage>~<n>`)."""
    return lineage_of(run_id) != run_id


def request_envelope(record_type: str, run_id: str, *, request_id: str | None,
                     now_ms: int, lineage_id: str | None = None) -> Envelope:
    """A request's envelope: keyed by the run's lineage (unless `lineage_id` says whose
    key it travels under, as an outbox entry records it)."""
    return Envelope(type=record_type, run_id=run_id,
                    lineage_id=lineage_of(run_id) if lineage_id is None else lineage_id,
                    request_id=request_id, timestamp_ms=now_ms)


def decision_envelope(record_type: str, run_id: str, *, lineage_id: str, epoch: int,
                      source_id: str, now_ms: int, source_seq: int | None = None,
                      request_id: str | None = None) -> Envelope:
    """An owner's decision's envelope: under the partition's `epoch`, from `source_id`
    (`source_seq`: None until the committer stamps it). `lineage_id`: the run's (a partition's
    own records use `partition/<n>`)."""
    return Envelope(type=record_type, run_id=run_id, lineage_id=lineage_id,
                    request_id=request_id, epoch=epoch, source_id=source_id,
                    source_seq=source_seq, timestamp_ms=now_ms)


def too_large_to_send(record: JournalRecord) -> EncodeError | None:
    """The error a record over the send limit raises where it is written (None: it fits);
    an owner raises it in place of sending (projections.sending answers it)."""
    size = len(encode(record)[0])
    if size <= MAX_SENT_RECORD_BYTES:
        return None
    return EncodeError(oversize_message(record, size), record.TYPE)


def oversize_message(record: JournalRecord, size: int) -> str:
    """Why `record`, `size` bytes encoded, is not sent (the worker's committer says the same)."""
    return (f"{record.TYPE} for run {record.envelope.run_id} is {size} bytes; "
            f"the limit is {MAX_SENT_RECORD_BYTES} bytes per journal record")
