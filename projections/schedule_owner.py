"""What a schedule's owner decides. Pure: no I/O; the owner's clock comes in as `now_ms`.

The owner answers each change request once (created, updated, deleted, fired for a trigger
or a backfill, or change-rejected with a reason), computing fire instants with
projections.cron and journaling them (`next_fire_ms`): the reducer only stores them. When a
schedule falls due (the fire index), `on_due` fires the instants due now, oldest first,
under the schedule's overlap policy; instants missed by more than the catch-up window (no
owner ran then) are skipped in one record with their count and range. A fired run's
settlement lets a buffered fire (buffer_one) go.

Both owners call these functions: the worker (engine.worker) and the TestEnvironment.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import (
    MAX_TIMEOUT_MS,
    NameInvalid,
    PayloadTooLarge,
    check_name,
    check_payload,
)
from runstream.projections import cron
from runstream.projections.payload_checks import payload_refusal
from runstream.projections.reactions import OwnerView, Reaction, RegisteredFlow, Write, subject_of
from runstream.projections.schedule_state import (
    ACTIONS,
    MAX_CHANGES,
    OVERFLOWED,
    OVERLAPS,
    Change,
    ScheduleSpec,
    ScheduleState,
)
from runstream.projections.schedules import BACKFILL
from runstream.projections.sending import Record
from runstream.projections.state import RunState

MAX_FIRES = 100  # fires (or skip records) one decision journals; the rest come next sweep
# Steps at most: of a skipped range, whole days or hours of a cron schedule
# (cron.fires_from) and then the instants within the jitter before the catch-up window,
# counted one by one; of a backfill, the instants looked at.
MAX_SCAN = 100_000
MAX_BACKFILL = 1000  # instants one backfill request fires at most
# The catch-up window is never shorter: an owner always fires a little after the instant
# (its sweep, its poll), and a fire that late is not a missed one (Temporal's minimum too).
MIN_CATCHUP_MS = 10_000
# An interval is never shorter (each instant makes a run: a typo's `1ms` made a thousand
# runs a second). A spec stored before this rule keeps its interval until it is changed.
MIN_EVERY_MS = 1_000


def catchup_window_ms(spec: ScheduleSpec) -> int:
    """The catch-up window the owner keeps: the spec's, never under MIN_CATCHUP_MS."""
    return max(spec.catchup_window_ms, MIN_CATCHUP_MS)


def every_too_short(every_ms: int) -> str:
    return (f"every must be at least {MIN_EVERY_MS / 1000:g} s, not {every_ms} ms (each "
            f"instant makes a run)")


class SpecInvalid(ValueError):
    """A change whose schedule cannot be made: the reason the owner journals."""


def carrier(schedule: ScheduleState) -> RunState:
    """What an owner's write names for a schedule decision: no run, the schedule's key and
    partition (a decision's envelope has the lineage as its Kafka key)."""
    return RunState(run_id="", lineage_id=schedule.schedule_id, partition=schedule.partition,
                    flow="", payload_json="", request_id="", request_offset=0,
                    created_at_ms=0, updated_at_ms=0)


def next_fire(spec: ScheduleSpec) -> Callable[[int], int]:
    """The schedule's next nominal instant strictly after a given one."""
    if spec.cron is not None:
        parsed = cron.parse_cron(spec.cron)
        return lambda after: cron.next_cron_ms(parsed, after, spec.timezone)
    assert spec.every_ms is not None
    every, offset = spec.every_ms, spec.offset_ms
    return lambda after: cron.next_every_ms(every, after, offset)


# -- changes ----------------------------------------------------------------------------------


def answer_changes(view: OwnerView, schedule: ScheduleState, now_ms: int) -> list[Reaction]:
    """Each change request not answered yet, once per ownership, in order (one write each:
    a later change sees the earlier one applied only through its record, so each is judged
    against the schedule as this one leaves it)."""
    reactions: list[Reaction] = []
    if view.writing(subject_of("", schedule.schedule_id)):
        # A decision about it is in flight (a fire): answered from the state before it, an
        # update named the instant just fired as the next, and that instant was handled
        # again (skipped as an overlap, or buffered and its successor lost). Answered once
        # it applies.
        return reactions
    current = schedule
    for change in current.changes:
        key = f"schedule-change/{change.request_id}"
        if key in view.decided:
            continue
        records = _answer(current, change, now_ms, view.flows)
        reactions.append(Write(carrier(schedule), tuple(
            (cls, {**body, "request_id": change.request_id}) for cls, body in records), key))
        break  # the next change is answered once this one is applied
    return reactions


def _answer(schedule: ScheduleState, change: Change, now_ms: int,
            flows: Mapping[str, RegisteredFlow]) -> list[Record]:
    sid = {"schedule_id": schedule.schedule_id}
    if change.body_json == OVERFLOWED:
        return [(ev.ScheduleChangeRejected, {**sid, "reason": (
            f"schedule {schedule.schedule_id!r} had {MAX_CHANGES} changes waiting for an "
            f"answer, the most it holds: send the {change.action} again")})]
    given: dict[str, Any] = json.loads(change.body_json)
    try:
        if change.action not in ACTIONS:  # (a plain producer's: an update, it was taken for)
            raise SpecInvalid(f"no action {change.action!r}: one of {', '.join(ACTIONS)}")
        if change.action == "create":
            if schedule.exists:
                raise SpecInvalid(f"schedule {schedule.schedule_id!r} exists already")
            # (a plain producer's create passes no client check: its fired runs' ids must
            # stay valid run ids within the limit)
            check_name("schedule id", schedule.schedule_id)
            spec = _spec(given, None)
            _check_payload(flows, spec, None)
            return [(ev.ScheduleCreated, {**sid, **_state(spec, given, now_ms)})]
        if not schedule.exists or schedule.spec is None:
            raise SpecInvalid(f"schedule {schedule.schedule_id!r} does not exist")
        _check_authority(schedule.spec, given)
        return _change_existing(schedule, change, given, now_ms, flows)
    except (SpecInvalid, cron.CronInvalid, NameInvalid, PayloadTooLarge, ValueError,
            OverflowError) as exc:  # (a time out of any calendar's range: rejected too)
        return [(ev.ScheduleChangeRejected, {**sid, "reason": str(exc)})]


def _change_existing(schedule: ScheduleState, change: Change, given: dict[str, Any],
                     now_ms: int, flows: Mapping[str, RegisteredFlow]) -> list[Record]:
    assert schedule.spec is not None
    sid = {"schedule_id": schedule.schedule_id}
    action = change.action
    if action == "delete":
        return [(ev.ScheduleDeleted, sid)]
    if action == "trigger":
        run_id = f"{schedule.schedule_id}@trigger/{change.request_id}"
        return [(ev.ScheduleFired, {**sid, "nominal_ms": now_ms, "run_id": run_id,
                                    "reason": "trigger", "next_fire_ms": None})]
    if action == "backfill":
        return _backfill(schedule, given, now_ms)
    paused = {"pause": True, "unpause": False}.get(action, given.get("paused", schedule.paused))
    # An update keeps the pause's note unless it gives one (it wiped "why" off a schedule
    # paused for a reason), and unpausing drops it.
    note = given.get("note") if action == "pause" else (
        given.get("note", schedule.note if paused else None) if action == "update" else None)
    spec = _spec(given, schedule.spec) if action == "update" else schedule.spec
    _check_payload(flows, spec, schedule.spec)
    # On from the instant the schedule was on, not from now: one past its time but not
    # due yet (its jitter) still fires, where a change made meanwhile dropped it. Only
    # while its instants stay the same: new ones are counted from now (those of a new
    # cron or interval before the change were fired at once, or skipped as missed).
    on = schedule.next_fire_ms
    same = all(getattr(spec, name) == getattr(schedule.spec, name)
               for name in ("cron", "every_ms", "offset_ms", "timezone"))
    since = now_ms if on is None or not same else min(now_ms, on - 1)
    return [(ev.ScheduleUpdated, {**sid, **_state(spec, {"paused": paused, "note": note},
                                                  since)})]


def _check_authority(spec: ScheduleSpec, given: dict[str, Any]) -> None:
    """A restricted authority (the relay says which) acts only on a schedule whose fired
    runs' ceiling its capabilities cover."""
    authority = given.get("authority")
    if authority is None:
        return
    allowed = set(given.get("authority_capabilities") or ())
    if spec.ceiling is None or not set(spec.ceiling) <= allowed:
        held = "any capability" if spec.ceiling is None else ", ".join(spec.ceiling)
        raise SpecInvalid(f"not allowed: authority {authority!r} does not cover the "
                          f"schedule's runs ({held})")


def _spec(given: dict[str, Any], base: ScheduleSpec | None) -> ScheduleSpec:
    """The spec `given` makes (over `base` for an update), checked: SpecInvalid says why."""
    fields: dict[str, Any] = {} if base is None else {
        name: getattr(base, name) for name in ScheduleSpec.__struct_fields__}
    fields.update({k: v for k, v in given.items() if k in ScheduleSpec.__struct_fields__})
    if given.get("cron") is not None and given.get("every_ms") is not None:
        raise SpecInvalid("give a schedule cron or every, not both")
    if base is not None and base.cron is not None and given.get("offset_ms") is None:
        fields["offset_ms"] = 0  # (a cron fires with none: none carries over to an every)
    if "cron" in given and given["cron"] is not None:
        fields["every_ms"] = None
    elif "every_ms" in given and given["every_ms"] is not None:
        fields["cron"] = None
    if fields.get("ceiling") is not None:
        fields["ceiling"] = tuple(sorted(fields["ceiling"]))
    if not fields.get("flow"):
        raise SpecInvalid("a schedule needs a flow")
    spec = ScheduleSpec(**fields)
    if (spec.cron is None) == (spec.every_ms is None):
        raise SpecInvalid("a schedule needs exactly one of cron and every")
    if spec.cron is not None and given.get("offset_ms"):
        # (an offset shifts an interval's instants; a cron's showed it and fired without it)
        raise SpecInvalid("an offset goes with every, not with cron (a cron names its own "
                          "instants: write them into it)")
    if spec.cron is not None and spec.offset_ms:  # (an every's, or a cron's made before)
        spec = ScheduleSpec(**{**fields, "offset_ms": 0})
    if spec.every_ms is not None and spec.every_ms <= 0:
        raise SpecInvalid(f"every must be more than 0, not {spec.every_ms} ms")
    if given.get("every_ms") is not None and spec.every_ms is not None \
            and spec.every_ms < MIN_EVERY_MS:
        raise SpecInvalid(every_too_short(spec.every_ms))
    if spec.cron is not None:
        cron.parse_cron(spec.cron)
    cron.check_timezone(spec.timezone)
    if spec.overlap not in OVERLAPS:
        raise SpecInvalid(f"overlap must be one of {', '.join(OVERLAPS)}, not {spec.overlap!r}")
    if spec.catchup_window_ms < 0 or spec.jitter_ms < 0 or spec.offset_ms < 0:
        raise SpecInvalid("the catch-up window, the jitter and the offset must be 0 or more")
    # (a plain producer's: past them a next fire time overflowed the record's 64 bits, its
    # answer could not be sent, and every later change of the schedule waited behind it)
    for name, ms in (("every", spec.every_ms or 0), ("the offset", spec.offset_ms),
                     ("the jitter", spec.jitter_ms),
                     ("the catch-up window", spec.catchup_window_ms)):
        if ms > MAX_TIMEOUT_MS:
            raise SpecInvalid(f"{name} must be at most {MAX_TIMEOUT_MS} ms (100 years), not "
                              f"{ms} ms")
    _check_runs(spec)
    return spec


def _check_runs(spec: ScheduleSpec) -> None:
    """What its fired runs' creates would be rejected for, at every fire (a plain
    producer's change passes no client check): their flow name, payload and timeout."""
    check_name("flow", spec.flow)
    json.loads(spec.payload_json)  # (ValueError: the payload is not JSON)
    check_payload(f"the payload of schedule runs of {spec.flow!r}", spec.payload_json)
    timeout = spec.run_timeout_ms
    if timeout is not None and not 0 < timeout <= MAX_TIMEOUT_MS:
        raise SpecInvalid(f"a run timeout is more than 0 ms and at most {MAX_TIMEOUT_MS} ms "
                          f"(100 years), not {timeout} ms")


def _check_payload(flows: Mapping[str, RegisteredFlow], spec: ScheduleSpec,
                   before: ScheduleSpec | None) -> None:
    """A payload the flow refuses (where the owner registers it) would have every fired
    run rejected: refused when a create or an update sets it (an update that leaves the
    flow and payload as they were is not judged again by a flow changed since)."""
    if before is not None and (before.flow, before.payload_json) == (spec.flow,
                                                                      spec.payload_json):
        return
    refusal = payload_refusal(flows, spec.flow, spec.payload_json)
    if refusal is not None:
        raise SpecInvalid(f"the schedule's runs would be rejected: {refusal}")


def _state(spec: ScheduleSpec, given: dict[str, Any], now_ms: int) -> dict[str, Any]:
    """A created or updated record's body: the whole spec, paused, and the next fire."""
    paused = bool(given.get("paused") or False)
    body = {name: getattr(spec, name) for name in ScheduleSpec.__struct_fields__}
    body["ceiling"] = None if spec.ceiling is None else list(spec.ceiling)
    return {**body, "paused": paused, "note": given.get("note"),
            "next_fire_ms": None if paused else next_fire(spec)(now_ms)}


def _backfill(schedule: ScheduleState, given: dict[str, Any], now_ms: int) -> list[Record]:
    """Fire the instants in (start, end] the schedule did not handle itself (outside its
    watermark range), up to now (an instant still to come is the schedule's own),
    MAX_BACKFILL at most, each as its own nominal run id."""
    assert schedule.spec is not None
    start, end = given.get("start_ms"), given.get("end_ms")
    if start is None or end is None or end <= start:
        raise SpecInvalid("a backfill needs a start before its end")
    if start >= now_ms:
        raise SpecInvalid("a backfill fires past instants: its start is not in the past")
    if start < 0:  # (before year 1 a fire's run id overflowed, and the worker stopped)
        raise SpecInvalid(f"a backfill starts at {cron.BACKFILL_EPOCH} or later")
    end = min(end, now_ms)
    chosen = cron.fires_between(next_fire(schedule.spec), start, end, MAX_BACKFILL,
                                skip=(*schedule.handled, *schedule.backfilled))
    if not chosen:
        raise SpecInvalid("no instant to backfill: the schedule fired or skipped each one "
                          "itself, or a backfill fired it")
    sid = schedule.schedule_id
    return [(ev.ScheduleFired, {"schedule_id": sid, "nominal_ms": t, "reason": BACKFILL,
                                "run_id": cron.fired_run_id(sid, t), "next_fire_ms": None})
            for t in chosen]


# -- fires --------------------------------------------------------------------------------------


def on_due(view: OwnerView, schedule: ScheduleState, now_ms: int) -> list[Reaction]:
    """The schedule fell due (the fire index): the instants due now, fired or skipped."""
    spec, nominal = schedule.spec, schedule.next_fire_ms
    if spec is None or schedule.due_ms is None or nominal is None or schedule.due_ms > now_ms:
        return []
    key = f"schedule-due/{schedule.schedule_id}/{nominal}"
    if key in view.decided:
        return []
    following = next_fire(spec)
    records: list[Record] = []
    # An instant is late by how long after its own due time (nominal plus its jitter) the
    # owner acts: the jitter is a delay the schedule asked for, not a missed fire.
    due = schedule.due_of
    window_start = now_ms - catchup_window_ms(spec)
    running = list(schedule.running)
    buffered = schedule.buffered_ms
    if nominal == schedule.kept_ms and (schedule.kept_at_ms or 0) >= window_start:
        # (kept by an update made within the window: on time however the new jitter puts
        # it; an owner acting long after the update finds it late, as any other)
        after = following(nominal)
        record, running, buffered = _fire_or_skip(schedule, nominal, after, running, buffered)
        records.append(record)
        nominal = after
    if due(nominal) < window_start:
        late = _late(schedule, nominal, window_start, following, due)
        records.append(late)
        nominal = late[1]["next_fire_ms"]
        if due(nominal) < window_start:  # (past MAX_SCAN steps: on from the window)
            nominal = following(window_start - 1)
    while due(nominal) <= now_ms and len(records) < MAX_FIRES:
        after = following(nominal)
        record, running, buffered = _fire_or_skip(schedule, nominal, after, running, buffered)
        records.append(record)
        nominal = after
    return [Write(carrier(schedule), tuple(_merged(records)), key)]


def _late(schedule: ScheduleState, first: int, window_start: int,
          following: Callable[[int], int], due: Callable[[int], int]) -> Record:
    """The instants due before the catch-up window (no owner ran then), skipped as one
    range; its next_fire_ms is the first instant due within the window. Those before the
    window by more than the jitter are late whatever their jitter, and counted at once
    (_certainly_late); the rest one by one, as their jitter says."""
    assert schedule.spec is not None
    count, last, at = _certainly_late(schedule.spec, first,
                                      window_start - schedule.spec.jitter_ms)
    looked = 0
    while due(at) < window_start and looked < MAX_SCAN:
        count, last, at, looked = count + 1, at, following(at), looked + 1
    return (ev.ScheduleSkipped, {"schedule_id": schedule.schedule_id, "count": count,
                                 "first_ms": first, "last_ms": last,
                                 "reason": "catch-up window", "next_fire_ms": at})


def _certainly_late(spec: ScheduleSpec, first: int, cutoff: int) -> tuple[int, int, int]:
    """The instants from `first` (one) before `cutoff`: how many, the last, the next."""
    if first >= cutoff:
        return 0, first, first
    if spec.cron is not None:
        return cron.fires_from(cron.parse_cron(spec.cron), spec.timezone, first, cutoff,
                               MAX_SCAN)
    assert spec.every_ms is not None
    count = -(-(cutoff - first) // spec.every_ms)  # (`first` is on the interval's grid)
    return count, first + (count - 1) * spec.every_ms, first + count * spec.every_ms


def _fire_or_skip(schedule: ScheduleState, nominal: int, after: int, running: list[str],
                  buffered: int | None) -> tuple[Record, list[str], int | None]:
    """One due instant under the overlap policy; the runs still running and the buffered
    fire after it."""
    assert schedule.spec is not None
    sid, overlap = schedule.schedule_id, schedule.spec.overlap
    run_id = cron.fired_run_id(sid, nominal)
    fired = {"schedule_id": sid, "nominal_ms": nominal, "run_id": run_id,
             "reason": "schedule", "next_fire_ms": after}
    # Under buffer_one a buffered fire not started yet holds the slot too (a settlement
    # just sent it): firing beside it ran two at once.
    taken = bool(running) or (overlap == "buffer_one" and buffered is not None)
    if not taken or overlap == "allow_all":
        return (ev.ScheduleFired, fired), [*running, run_id], buffered
    if overlap == "cancel_other":
        return (ev.ScheduleFired, {**fired, "cancel_run_id": running[-1]}), [run_id], buffered
    if overlap == "buffer_one" and buffered is None:
        return (ev.ScheduleSkipped, {"schedule_id": sid, "count": 1, "first_ms": nominal,
                                     "last_ms": nominal, "reason": "buffered",
                                     "next_fire_ms": after}), running, nominal
    return (ev.ScheduleSkipped, {"schedule_id": sid, "count": 1, "first_ms": nominal,
                                 "last_ms": nominal, "reason": "overlap",
                                 "next_fire_ms": after}), running, buffered


def _merged(records: list[Record]) -> list[Record]:
    """Consecutive overlap skips as one record (their count and range)."""
    merged: list[Record] = []
    for cls, body in records:
        if merged and cls is ev.ScheduleSkipped and body["reason"] == "overlap":
            last_cls, last = merged[-1]
            if last_cls is ev.ScheduleSkipped and last["reason"] == "overlap":
                merged[-1] = (cls, {**last, "count": last["count"] + body["count"],
                                    "last_ms": body["last_ms"],
                                    "next_fire_ms": body["next_fire_ms"]})
                continue
        merged.append((cls, body))
    return merged


def on_settled(view: OwnerView, schedule: ScheduleState) -> list[Reaction]:
    """A fired run settled: the fire buffered meanwhile (buffer_one) goes now."""
    buffered = schedule.buffered_ms
    if buffered is None or schedule.running or not schedule.exists or schedule.paused:
        return []
    key = f"schedule-buffered/{schedule.schedule_id}/{buffered}"
    if key in view.decided:
        return []
    sid = schedule.schedule_id
    return [Write(carrier(schedule), ((ev.ScheduleFired, {
        "schedule_id": sid, "nominal_ms": buffered, "run_id": cron.fired_run_id(sid, buffered),
        "reason": "buffered", "next_fire_ms": None}),), key)]


def on_record(view: OwnerView, schedule: ScheduleState, record: ev.JournalRecord,
              now_ms: int) -> list[Reaction]:
    """What follows an applied schedule record, in a partition the owner executes."""
    reactions = answer_changes(view, schedule, now_ms)
    if isinstance(record, ev.ScheduleRunSettled):
        reactions += on_settled(view, schedule)
    return reactions


def on_claim(view: OwnerView, schedule: ScheduleState, now_ms: int) -> list[Reaction]:
    """At a claim: its changes not answered, a buffered fire whose run settled meanwhile
    (a due fire is the sweeper's)."""
    return answer_changes(view, schedule, now_ms) + on_settled(view, schedule)

