"""Outbox requests as records, and what replaces one that can never be sent. Pure: no I/O,
no clock (the caller passes the time).

An owner's outbox (engine.worker.outbox; engine.testing.env sends the same items) holds the
requests its decisions caused for other runs. One can fail for good before it reaches the
broker: its body no longer fits its record type (an entry written by an older version:
"old-shape"), it cannot be encoded ("encode-error"), or it is larger than one journal
record ("too-large"). Sending it again on every claim would stop its partition for ever,
so the owner gives it up: it dead-letters it with its reason, acknowledges it like a sent
one (`partition.outbox-sent`), and answers whoever waits for it:

  create (a spawn)      the parent's spawn fails: a wake of the parent, in the parent's own
                        partition, child_status failed, error_type SpawnRefused, with the
                        request id and shape of a refused spawn's
                        (projections.outbox_requests.refused_spawn)
  wake (a child settled)  a minimal wake under the same request id: the child failed with
                        ResultUndeliverable, "result could not be delivered: ...", so the
                        parent's `child.result()` raises ChildFailed instead of waiting
  create (a fire)       a small create under the same ids (`unsendable` set), which every
                        owner rejects: the schedule hears the run was rejected, and a
                        handle to the fired run raises
  cancel (a cascade)    evidence (`evidence.recorded`) on the run that sent it
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from runstream.engine.errors import journal_text
from runstream.engine.journal import EncodeError, JournalRecord
from runstream.engine.journal import events as ev
from runstream.engine.journal.events import RECORD_CLASSES
from runstream.engine.journal.records import lineage_of, request_envelope, too_large_to_send
from runstream.projections.outbox_requests import refused_spawn, wake_request
from runstream.projections.sending import RESULT_UNDELIVERABLE
from runstream.projections.state import InboxItem, OutboxItem, RunStatus

UnsendableReason = Literal["old-shape", "encode-error", "too-large"]
CANCEL_UNDELIVERABLE = "cancel-undeliverable"  # the evidence kind a given-up cancel leaves
TEXT_LIMIT = 500  # characters of an error's detail a replacement or evidence carries


class OldShape(ValueError):
    """An outbox entry whose stored body does not make a record of its type (written by an
    older version, or damaged)."""


def request_of(item: OutboxItem, timestamp_ms: int) -> JournalRecord:
    """The request record `item` stands for; OldShape when its body does not make one."""
    cls = RECORD_CLASSES.get(item.type)
    if cls is None or cls.KIND != "request":
        raise OldShape(f"outbox entry {item.request_id!r} has type {item.type!r}, not a "
                       f"request type")
    envelope = request_envelope(item.type, item.run_id, lineage_id=item.lineage_id,
                                request_id=item.request_id, now_ms=timestamp_ms)
    try:
        body = json.loads(item.body_json)
        return cls(envelope=envelope, **body)
    except (ValueError, TypeError) as exc:  # not JSON, not an object, wrong fields
        raise OldShape(f"outbox entry {item.request_id!r} ({item.type}) does not make a "
                       f"record of its type: {exc}") from exc


def checked_request(item: OutboxItem, timestamp_ms: int) -> JournalRecord | GiveUp:
    """The request to send, or `item` given up: for a writer that does not encode records
    itself (engine.testing.env; the worker's committer encodes, and checks the size, once,
    against the same limit: engine.journal.records.too_large_to_send)."""
    try:
        record = request_of(item, timestamp_ms)
        too_large = too_large_to_send(record)
    except OldShape as exc:
        return give_up(item, "old-shape", str(exc))
    except EncodeError as exc:
        return give_up(item, "encode-error", str(exc))
    if too_large is not None:
        return give_up(item, "too-large", str(too_large))
    return record


@dataclass(frozen=True, slots=True)
class Note:
    """Evidence to record on the run that sent a request given up."""

    run_id: str
    kind: str
    message: str
    attributes: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GiveUp:
    """An outbox request given up: why, and what answers in its place."""

    item: OutboxItem
    reason: UnsendableReason
    detail: str
    replacement: OutboxItem | None = None  # a wake to send instead
    evidence: Note | None = None  # on the sender run

    @property
    def summary(self) -> str:
        """One line for the log and the dead letter's detail."""
        return (f"{self.item.type} {self.item.request_id!r} for run {self.item.run_id!r} "
                f"cannot be sent ({self.reason}): {self.detail}")


def give_up(item: OutboxItem, reason: UnsendableReason, detail: str) -> GiveUp:
    """What replaces `item`, which cannot be sent for `reason`."""
    text = journal_text(detail, TEXT_LIMIT)
    body = _body(item)
    if item.type == ev.RunCreateRequested.TYPE:
        return GiveUp(item, reason, text, replacement=(
            _spawn_refused(item, body, reason, text) or _fire_refused(item, body, reason, text)))
    if item.type == ev.RunWakeRequested.TYPE:
        return GiveUp(item, reason, text, replacement=_minimal_wake(item, body, text))
    if item.type == ev.RunCancelRequested.TYPE:
        return GiveUp(item, reason, text, evidence=_cancel_note(item, body, reason, text))
    return GiveUp(item, reason, text)


def _body(item: OutboxItem) -> dict[str, Any]:
    """As much of the stored body as parses (an old shape may still name its runs)."""
    try:
        body = json.loads(item.body_json)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _text(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    return value if isinstance(value, str) and value else None


def _number(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _spawn_refused(item: OutboxItem, body: dict[str, Any], reason: UnsendableReason,
                   detail: str) -> OutboxItem | None:
    """A spawn's create: its request id is `spawn/<parent>/<position>`."""
    prefix, _, tail = item.request_id.partition("/")
    parent_from_id, _, position_text = tail.rpartition("/")
    parent = _text(body, "parent_run_id") or (parent_from_id if prefix == "spawn" else None)
    position = _number(body, "parent_position")
    if position is None and prefix == "spawn" and position_text.isdigit():
        position = int(position_text)
    if parent is None:
        return None  # not a spawn's: nobody waits for it
    request = InboxItem(request_id=item.request_id, type=item.type, offset=0,
                        parent_run_id=parent,
                        parent_lineage_id=_text(body, "parent_lineage_id") or lineage_of(parent),
                        parent_position=position)
    why = f"the create request of child {item.run_id} cannot be sent ({reason}): {detail}"
    return refused_spawn(item.run_id, request, why)


def _fire_refused(item: OutboxItem, body: dict[str, Any], reason: UnsendableReason,
                  detail: str) -> OutboxItem | None:
    """A schedule's fire: a small create under the same run id and request id, which its
    owner rejects (reason unsendable), as any create it rejects. So its schedule hears the
    run was rejected (it kept the run as running for ever, and an overlap policy but
    allow_all skipped or held every later instant), and whoever waits for the fired run (a
    handle from trigger_schedule's id) is told why, where it waited out its timeout."""
    schedule_id = _text(body, "schedule_id")
    if schedule_id is None:
        return None
    why = f"the create of fired run {item.run_id} cannot be sent ({reason}): {detail}"
    stand_in = {"flow": _text(body, "flow") or "", "payload_json": "null",
                "schedule_id": schedule_id, "unsendable": journal_text(why, TEXT_LIMIT)}
    return OutboxItem(request_id=item.request_id, type=item.type, run_id=item.run_id,
                      lineage_id=item.lineage_id, body_json=json.dumps(stand_in))


def _minimal_wake(item: OutboxItem, body: dict[str, Any], detail: str) -> OutboxItem | None:
    """The same wake without the child's outcome: the child failed, for its parent."""
    child = _text(body, "child_run_id")
    if child is None:
        return None  # which child settled is unknown: no spawn entry to answer
    return wake_request(item.request_id, item.run_id, item.lineage_id, child_run_id=child,
                        child_status=RunStatus.failed, position=_number(body, "position"),
                        error_type=RESULT_UNDELIVERABLE,
                        error_message=f"result could not be delivered: {detail}")


def _cancel_note(item: OutboxItem, body: dict[str, Any], reason: UnsendableReason,
                 detail: str) -> Note | None:
    """A cascade's cancel: its request id is `cancel/<sender>/<child>`."""
    sender = _text(body, "requested_by")
    prefix = "cancel/"
    suffix = f"/{item.run_id}"
    if (sender is None and item.request_id.startswith(prefix)
            and item.request_id.endswith(suffix)):
        sender = item.request_id[len(prefix):-len(suffix)] or None
    if sender is None:
        return None
    return Note(run_id=sender, kind=CANCEL_UNDELIVERABLE,
                message=f"the cancel of run {item.run_id} could not be sent ({reason}): "
                        f"{detail}",
                attributes={"child_run_id": item.run_id, "request_id": item.request_id,
                            "reason": reason})
