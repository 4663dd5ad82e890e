"""What the requests relay (engine.worker.relay) does with one record: forward it, maybe
narrowed to its authority, or refuse it with a reason and copy it to the dead letters.
Pure: no I/O (the authorities' file is read at start-up, by load_authorities).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from runstream.engine.config import requests_topic
from runstream.engine.errors import InvalidInput, journal_text
from runstream.engine.flow.schedule_spec import check_schedule_id
from runstream.engine.journal import MAX_RECORD_BYTES, DecodeError, JournalRecord, decode, encode
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import check_authority_name, check_run_id
from runstream.engine.journal.records import is_round, lineage_of
from runstream.engine.kafka import relay_refusals
from runstream.projections.capabilities import narrow
from runstream.projections.partitioning import run_partition
from runstream.projections.poison import newer_record
from runstream.projections.reserved_ids import relay_refusal

AUTHORITIES_ENV = "RUNSTREAM_AUTHORITIES"
AUTHORITY_HEADER = "runstream-authority"
# (why and whence, on a refused request's copy: a client waiting for its request reads them)
REASON_HEADER, SOURCE_HEADER = relay_refusals.REASON_HEADER, relay_refusals.SOURCE_HEADER
# The refused record's value size, on a copy that had to leave the value out.
SIZE_HEADER = "runstream-dead-letter-size"
# A request's own headers, at most: a forward (value up to MAX_RECORD_BYTES, plus these)
# then fits the producer's 1 MiB and the journal's max.message.bytes. A copy to the dead
# letters larger than the value and these leaves both out, with the value's size: a copy
# the producer refused stopped the relay for good, reading the record again and again.
MAX_HEADER_BYTES = 16 * 1024
MAX_REASON_CHARS = 2000  # a dead letter's reason, at most (its UTF-8: 8 KiB at most)

CLIENT_REQUESTS = (ev.RunCreateRequested, ev.RunSignalSent, ev.RunCancelRequested,
                   ev.RunResumeRequested, ev.RunForkRequested, ev.ScheduleChangeRequested,
                   ev.RunSignalWithStartRequested, ev.RunUpdateRequested)
# What a restricted authority may send (a resume that resolves a quarantine, retry or skip,
# says whether an irreversible effect happened: an operator's action, on the unrestricted
# topic).
RESTRICTED_REQUESTS = (ev.RunCreateRequested, ev.RunSignalSent, ev.RunCancelRequested,
                       ev.RunResumeRequested, ev.RunForkRequested, ev.ScheduleChangeRequested,
                       ev.RunSignalWithStartRequested, ev.RunUpdateRequested)
# The requests that carry an authority (projections.requests.covers; a schedule's owner
# checks a schedule change's: projections.schedule_owner).
AUTHORITY_REQUESTS = (ev.RunSignalSent, ev.RunCancelRequested, ev.RunResumeRequested,
                      ev.RunForkRequested, ev.ScheduleChangeRequested,
                      ev.RunSignalWithStartRequested, ev.RunUpdateRequested)

Authorities = Mapping[str, frozenset[str]]
Headers = list[tuple[str, bytes]]


def load_authorities(path: Path | None = None) -> dict[str, frozenset[str]]:
    """Authority name -> its capabilities, from the JSON file `path`, else from
    RUNSTREAM_AUTHORITIES, else none (then every restricted topic is refused)."""
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise InvalidInput(f"cannot read the authorities file {path}: {exc}") from None
        where = str(path)
    else:
        text, where = os.environ.get(AUTHORITIES_ENV, "").strip(), AUTHORITIES_ENV
        if not text:
            return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{where} is not valid JSON ({exc.msg} at column {exc.colno})"
                           ) from None
    if not isinstance(data, dict) or not all(
            isinstance(caps, list) and all(isinstance(c, str) for c in caps)
            for caps in data.values()):
        raise InvalidInput(f'{where} must be a JSON object {{"authority": ["capability", '
                           f'...], ...}}')
    return {check_authority_name(name): frozenset(caps) for name, caps in data.items()}


@dataclass(frozen=True, slots=True)
class Incoming:
    """One record read from a requests topic."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]


@dataclass(frozen=True, slots=True)
class Forward:
    value: bytes
    headers: Headers


@dataclass(frozen=True, slots=True)
class Refuse:
    reason: str


def authority_of(topic: str, namespace: str) -> str | None:
    """None for `<ns>.requests`, the authority's name for `<ns>.requests.<authority>`."""
    base = requests_topic(namespace)
    return None if topic == base else topic.removeprefix(base + ".")


def header_bytes(headers: Iterable[tuple[str, bytes]]) -> int:
    return sum(len(name.encode(errors="replace")) + len(value or b"")
               for name, value in headers)


def dead_letter_copy(incoming: Incoming, reason: str
                     ) -> tuple[bytes | None, list[tuple[str, bytes]]]:
    """What a refused record's dead letter holds: the record whole, with why and whence;
    one larger than a request may be, only why, whence and its value's size."""
    source = f"{incoming.topic}:{incoming.partition}:{incoming.offset}"
    # (a reason quotes the client's text, a fork's source id up to the record's size: whole,
    # the copy passed the producer's 1 MiB, and the relay read the record again for ever)
    shown = journal_text(reason, limit=MAX_REASON_CHARS)
    ours = [(REASON_HEADER, shown.encode()), (SOURCE_HEADER, source.encode())]
    size = len(incoming.value or b"")
    if size <= MAX_RECORD_BYTES and header_bytes(incoming.headers) <= MAX_HEADER_BYTES:
        return incoming.value, [*incoming.headers, *ours]
    return None, [*ours, (SIZE_HEADER, b"%d" % size)]


def judge(incoming: Incoming, namespace: str, authorities: Authorities,
          journal_partitions: int) -> Forward | Refuse:
    """What the relay does with one record: forward it (maybe narrowed) or refuse it."""
    authority = authority_of(incoming.topic, namespace)
    if authority is not None and authority not in authorities:
        return Refuse(f"authority {authority!r} is not configured ({AUTHORITIES_ENV}): "
                      f"nothing from {incoming.topic} is relayed")
    if incoming.value is None or len(incoming.value) > MAX_RECORD_BYTES:
        size = 0 if incoming.value is None else len(incoming.value)
        return Refuse(f"not a request: {size} bytes (a request is 1..{MAX_RECORD_BYTES})")
    if header_bytes(incoming.headers) > MAX_HEADER_BYTES:
        return Refuse(f"not a request: {header_bytes(incoming.headers)} bytes of headers "
                      f"(a request has {MAX_HEADER_BYTES} at most)")
    try:
        record = decode(incoming.value, incoming.headers)
    except DecodeError as exc:
        newer = newer_record(exc, incoming.headers, None)  # (a newer client's: say so)
        return Refuse(f"decode error: {exc.reason}: {exc.detail}" + (
            f" (a {newer.record_type} request of a newer runstream: upgrade the workers)"
            if newer is not None else ""))
    why = _not_relayable(record, authority, incoming, journal_partitions)
    if why is not None:
        return Refuse(why)
    if authority is None:
        return _unrestricted(record, incoming)
    return _restricted(record, authority, authorities[authority], incoming.headers)


def _not_relayable(record: JournalRecord, authority: str | None, incoming: Incoming,
                   journal_partitions: int) -> str | None:
    if record.KIND != "request":
        return f"not a request: {record.TYPE} is a decision, written only by a partition's owner"
    if not isinstance(record, CLIENT_REQUESTS) or _names_a_parent(record):
        return f"not a client request: this {record.TYPE} is sent only by a partition's owner"
    if authority is not None and not isinstance(record, RESTRICTED_REQUESTS):
        return f"not allowed: {record.TYPE} is an operator's request, not {authority!r}'s"
    env = record.envelope
    if not env.request_id:
        return "not a request: no request_id (a re-forward could apply it twice)"
    if isinstance(record, ev.RunForkRequested):
        why = _not_a_fork_request(record)
        if why is not None:
            return why
    if isinstance(record, ev.ScheduleChangeRequested):
        return _not_a_schedule_change(record, incoming, journal_partitions)
    try:
        check_run_id(env.run_id)
    except InvalidInput as exc:
        return f"invalid input: {exc}"
    if isinstance(record, ev.RunCreateRequested) and is_round(env.run_id):
        return (f"invalid input: run id {env.run_id!r} names a round of lineage "
                f"{lineage_of(env.run_id)!r} (`<lineage>~<n>`): a create makes a round 0")
    taken = relay_refusal(record, authority)
    if taken is not None:
        return f"not allowed: {taken}"
    lineage = lineage_of(env.run_id)
    if env.lineage_id != lineage or incoming.key != lineage.encode():
        return f"wrong key: a request for run {env.run_id} is keyed by its lineage {lineage}"
    if incoming.partition != run_partition(env.run_id, journal_partitions):
        return (f"wrong partition: run {env.run_id} lives in journal partition "
                f"{run_partition(env.run_id, journal_partitions)}, not {incoming.partition}")
    return None


def _not_a_schedule_change(record: ev.ScheduleChangeRequested, incoming: Incoming,
                           journal_partitions: int) -> str | None:
    """A schedule change names no run and is keyed by its schedule's id."""
    schedule_id, env = record.schedule_id, record.envelope
    try:
        check_schedule_id(schedule_id)
    except InvalidInput as exc:
        return f"invalid input: {exc}"
    if env.run_id or env.lineage_id != schedule_id or incoming.key != schedule_id.encode():
        return (f"wrong key: a change of schedule {schedule_id} names no run and is keyed by "
                f"the schedule's id")
    if incoming.partition != run_partition(schedule_id, journal_partitions):
        return (f"wrong partition: schedule {schedule_id} lives in journal partition "
                f"{run_partition(schedule_id, journal_partitions)}, not {incoming.partition}")
    return None


def _not_a_fork_request(record: ev.RunForkRequested) -> str | None:
    """A client's fork request names the source (its envelope's run), the point and the
    new run, and carries no journal content."""
    if record.target_run_id is None or record.entries_json or record.part != 0 or (
            record.parts != 1):
        return ("not a client request: a fork request carrying journal entries (its first "
                "shape) is refused; the source run's owner sends a fork's entries")
    if record.source_run_id != record.envelope.run_id:
        return (f"invalid input: a fork request goes to its source run "
                f"{record.source_run_id}, not to {record.envelope.run_id}")
    try:
        check_run_id(record.target_run_id, new=True)
    except InvalidInput as exc:
        return f"invalid input: {exc}"
    return None


def _names_a_parent(record: JournalRecord) -> bool:
    """A create that makes a child or a later round: only owners send those (a client's
    could claim to be someone's child and settle its parent's spawn)."""
    return isinstance(record, ev.RunCreateRequested) and (
        record.parent_run_id is not None or record.parent_lineage_id is not None
        or record.parent_position is not None or record.round != 0 or bool(record.ancestors)
        or record.parent_exit_policy is not None)


def _unrestricted(record: JournalRecord, incoming: Incoming) -> Forward:
    """A request from `<ns>.requests`: forwarded unchanged, but for an authority it claims
    to carry, which only the relay sets."""
    if isinstance(record, AUTHORITY_REQUESTS) and (
            record.authority is not None or record.authority_capabilities):
        value, _ = encode(dataclasses.replace(record, authority=None,
                                              authority_capabilities=[]))
        return Forward(value, [(k, v) for k, v in incoming.headers if k != AUTHORITY_HEADER])
    return Forward(incoming.value or b"", [(k, v) for k, v in incoming.headers
                                           if k != AUTHORITY_HEADER])


def _restricted(record: JournalRecord, authority: str, capabilities: frozenset[str],
                headers: Sequence[tuple[str, bytes]]) -> Forward | Refuse:
    """A restricted authority's request: a new run's ceiling narrowed to the authority's
    capabilities, whatever the request declared; a request to an existing run carrying the
    authority, which the reducer checks against that run's ceiling; tagged."""
    tagged = [(k, v) for k, v in headers if k != AUTHORITY_HEADER]
    tagged.append((AUTHORITY_HEADER, authority.encode()))
    if isinstance(record, ev.RunCreateRequested):
        ceiling = narrow(capabilities, record.ceiling)
        record = dataclasses.replace(record, ceiling=None if ceiling is None else list(ceiling))
    elif isinstance(record, ev.ScheduleChangeRequested | ev.RunSignalWithStartRequested):
        # (its runs' ceiling narrowed as a create's; the owner checks the authority covers
        # an existing schedule before it changes, fires or deletes it; the reducer, that it
        # covers an existing run before the signal is taken). A schedule's change other than
        # its create that names no ceiling keeps the schedule's: narrowed to this
        # authority's, a note widened it, and locked out the authority that made it.
        keeps = (isinstance(record, ev.ScheduleChangeRequested) and record.action != "create"
                 and record.ceiling is None)
        ceiling = None if keeps else narrow(capabilities, record.ceiling)
        record = dataclasses.replace(record, ceiling=None if ceiling is None else list(ceiling),
                                     authority=authority,
                                     authority_capabilities=sorted(capabilities))
    elif isinstance(record, AUTHORITY_REQUESTS):
        record = dataclasses.replace(record, authority=authority,
                                     authority_capabilities=sorted(capabilities))
    value, _ = encode(_said_by(record, authority))
    if len(value) > MAX_RECORD_BYTES:  # (it grew by the authority's fields: refused here
        # with its reason, where the journal dead-lettered it as oversize)
        return Refuse(f"too large: {len(value)} bytes once it carries authority "
                      f"{authority!r}, over the journal's {MAX_RECORD_BYTES}")
    return Forward(value, tagged)


def _said_by(record: JournalRecord, authority: str) -> JournalRecord:
    """Who asked, as the history shows it (a cancel's or fork's requested_by, a resume's
    operator), prefixed by the authority the request came through: a restricted client
    named anyone ("admin@ops"), and nothing in the history said it came through it."""
    def said(given: str | None) -> str:
        return f"authority {authority}" + (f": {given}" if given else "")
    if isinstance(record, ev.RunCancelRequested | ev.RunForkRequested):
        return dataclasses.replace(record, requested_by=said(record.requested_by))
    if isinstance(record, ev.RunResumeRequested):
        return dataclasses.replace(record, operator=said(record.operator))
    return record
