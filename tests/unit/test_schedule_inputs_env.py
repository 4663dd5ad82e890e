"""A schedule's inputs, checked as a run's are (review of issue 20): a burst of changes past
the pending bound is refused, not dropped; a plain producer's spec its fired runs could never
be created from is refused at once, not at every fire; a fire whose create cannot be sent
frees the schedule; an update keeps a pause's note; a schedule made again starts counting
from 0 (tests/integration/test_schedule_inputs.py: the same on a broker)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from runstream import DurationInvalid, Flow, InvalidInput, RunNotFound, ScheduleRejected
from runstream.engine.journal import events as ev
from runstream.engine.journal.records import request_envelope
from runstream.projections.decide import UNSENDABLE, Reject, decide_create
from runstream.projections.outbox_fallback import give_up, request_of
from runstream.projections.requests import inbox_item
from runstream.projections.schedule_owner import _answer
from runstream.projections.schedule_state import (
    MAX_CHANGES,
    MAX_OVERFLOW,
    OVERFLOWED,
    ScheduleState,
)
from runstream.projections.schedules import apply_schedule
from runstream.projections.state import OutboxItem, PartitionState, RunState
from runstream.testing import TestEnvironment

tock = Flow("si-tock")
START = datetime(2026, 3, 1, tzinfo=UTC)


@tock.handler
async def _tock(ctx: Any, payload: Any) -> Any:
    return payload


def change(schedule_id: str, request_id: str, action: str = "trigger",
           **fields: Any) -> ev.ScheduleChangeRequested:
    """A change request as a plain producer writes it."""
    return ev.ScheduleChangeRequested(
        envelope=request_envelope(ev.ScheduleChangeRequested.TYPE, "", request_id=request_id,
                                  now_ms=0, lineage_id=schedule_id),
        schedule_id=schedule_id, action=action, **fields)


# A plain producer's spec no fired run could be created from, and why it is refused.
BAD_SPECS = [
    ({"action": "bogus"}, "no action 'bogus'"),
    ({"cron": "0 * * * *", "every_ms": 60_000}, "cron or every, not both"),
    ({"every_ms": 60_000, "payload_json": "{not json"}, "Expecting property name"),
    ({"every_ms": 60_000, "run_timeout_ms": -1}, "a run timeout is more than 0 ms"),
    ({"every_ms": 60_000, "offset_ms": -5}, "must be 0 or more"),
    ({"every_ms": 60_000, "flow": "no such flow!"}, "flow name"),
    ({"every_ms": 60_000, "payload_json": json.dumps("x" * 600_000)}, "over the"),
    ({"every_ms": 1}, "every must be at least 1 s, not 1 ms"),
]


@pytest.mark.parametrize(("fields", "reason"), BAD_SPECS)
async def test_a_spec_no_run_could_be_created_from_is_refused(fields: dict[str, Any],
                                                              reason: str) -> None:
    async with TestEnvironment([tock], start=START) as env:
        given = {"action": "create", "flow": tock.name, **fields}
        env.log.append(env.partition_of("s"), change("s", "bad", **given))
        [answer] = [h.record for h in env.projection.partition_history[env.partition_of("s")]
                    if isinstance(h.record, ev.ScheduleChangeRejected)]
        assert reason in answer.reason, answer.reason
        await env.sleep(180)
        assert env.list_schedules() == [] and env.projection.runs == {}


def test_changes_past_the_pending_bound_are_kept_to_be_refused() -> None:
    """Past MAX_CHANGES a change is kept without its fields, and answered with a refusal
    (it was ignored: its caller waited 30 s and heard 'is a worker up?'); past both bounds
    it is ignored."""
    partition, schedule = PartitionState(partition=0), None
    total = MAX_CHANGES + MAX_OVERFLOW + 1
    for n in range(total):
        applied = apply_schedule(partition, schedule, change("s", f"r{n}"), n, 0)
        partition, schedule = applied.partition, applied.schedule
    assert isinstance(schedule, ScheduleState)
    kept = [c for c in schedule.changes if c.body_json != OVERFLOWED]
    assert len(kept) == MAX_CHANGES and len(schedule.changes) == MAX_CHANGES + MAX_OVERFLOW
    [(cls, body)] = _answer(schedule, schedule.changes[-1], 0, {})
    assert cls is ev.ScheduleChangeRejected
    assert body["reason"] == (f"schedule 's' had {MAX_CHANGES} changes waiting for an answer, "
                              f"the most it holds: send the trigger again")


def test_a_fire_whose_create_cannot_be_sent_is_replaced_by_a_create_every_owner_rejects(
) -> None:
    """The schedule kept the run as running for ever (under skip, every later instant was
    skipped as an overlap), and a handle to the fired run waited out its timeout: a small
    create under the same ids, rejected `unsendable` whatever the run, answers both."""
    item = OutboxItem(request_id="fire/s@1", type=ev.RunCreateRequested.TYPE, run_id="s@1",
                      lineage_id="s@1", body_json=json.dumps({"flow": "f", "schedule_id": "s",
                                                              "payload_json": "x" * 10}))
    replacement = give_up(item, "too-large", "over the record limit").replacement
    assert replacement is not None and replacement.type == ev.RunCreateRequested.TYPE
    assert (replacement.request_id, replacement.run_id) == ("fire/s@1", "s@1")
    stand_in = request_of(replacement, 0)
    assert isinstance(stand_in, ev.RunCreateRequested)
    assert (stand_in.flow, stand_in.payload_json, stand_in.schedule_id) == ("f", "null", "s")
    assert stand_in.unsendable == ("the create of fired run s@1 cannot be sent (too-large): "
                                   "over the record limit")
    request = inbox_item(stand_in, "fire/s@1", 7)
    existing = RunState(run_id="s@1", lineage_id="s@1", flow="f", partition=0,
                        request_id="other", payload_json="1", request_offset=3,
                        created_at_ms=0, updated_at_ms=0, admitted=True)
    for run in (None, existing):
        assert decide_create(run, request, lambda flow, payload: None) == Reject(
            UNSENDABLE, "request", "", stand_in.unsendable)


async def test_an_update_keeps_the_pause_note_and_a_new_schedule_counts_from_zero() -> None:
    async with TestEnvironment([tock], start=START) as env:
        await env.create_schedule("s", tock, {"n": 1}, every=60)
        await env.sleep(190)
        await env.pause_schedule("s", note="db migration until friday")
        await env.update_schedule("s", payload={"n": 2})
        assert env.describe_schedule("s").note == "db migration until friday"
        await env.update_schedule("s", payload={"n": 3}, note="until monday")
        assert env.describe_schedule("s").note == "until monday"
        await env.unpause_schedule("s")
        assert env.describe_schedule("s").note is None
        assert env.describe_schedule("s").fires == 3
        await env.delete_schedule("s")
        await env.create_schedule("s", tock, {"n": 1}, every=60)
        made_again = env.describe_schedule("s")
        assert (made_again.fires, made_again.skipped, made_again.recent) == (0, 0, ())


async def test_the_client_checks_a_schedule_s_payload_and_run_timeout() -> None:
    async with TestEnvironment([tock], start=START) as env:
        with pytest.raises(InvalidInput, match="over the 524288-byte limit"):
            await env.create_schedule("s", tock, "x" * 600_000, every=60)
        with pytest.raises(DurationInvalid, match="at most 100 years"):
            await env.create_schedule("s", tock, every=60, run_timeout=timedelta(days=365 * 200))
        assert env.list_schedules() == []


class Order(BaseModel):
    order_id: str


typed_tock = Flow("si-typed", payload=Order)


@typed_tock.handler
async def _typed_tock(ctx: Any, payload: Order) -> str:
    return payload.order_id


async def test_a_fired_run_whose_create_was_rejected_says_why() -> None:
    """As a Client's describe: the environment said "no run ... check the id"."""
    async with TestEnvironment([typed_tock], start=START) as env:
        await env.create_schedule("t", typed_tock, Order(order_id="a"), every=3600)
        # An owner that does not register the flow takes a payload it cannot judge (a mixed
        # deployment); the fired run's owner, which does, rejects its create.
        registered = env.flows.pop(typed_tock.name)
        await env.update_schedule("t", payload={"order_id": 5})
        env.flows[typed_tock.name] = registered
        run_id = await env.trigger_schedule("t")
        with pytest.raises(RunNotFound, match=r"its create was rejected \(payload-invalid"):
            await env.result(run_id)
        with pytest.raises(RunNotFound, match="order_id: Input should be a valid string"):
            env.describe(run_id)


async def test_the_owner_refuses_a_payload_its_flow_refuses() -> None:
    """By the flow's name (a client without the Flow object, the CLI, a plain producer):
    accepted, every fire was then rejected."""
    async with TestEnvironment([typed_tock], start=START) as env:
        with pytest.raises(ScheduleRejected, match=r"runs would be rejected.*order_id"):
            await env.create_schedule("t", typed_tock.name, {"order_id": 5}, every=3600)
        assert env.list_schedules() == []
        await env.create_schedule("t", typed_tock.name, {"order_id": "a"}, every=3600)
        with pytest.raises(ScheduleRejected, match="runs would be rejected"):
            await env.update_schedule("t", payload={"order_id": 5})
        await env.update_schedule("t", every=60)  # (its payload is not judged again)
        assert json.loads(env.describe_schedule("t").spec.payload_json) == {"order_id": "a"}


async def test_an_offset_goes_with_every_and_not_with_cron() -> None:
    # (a cron schedule took --offset, showed it, and fired without it)
    async with TestEnvironment([tock], start=START) as env:
        with pytest.raises(InvalidInput, match="an offset goes with every, not with cron"):
            await env.create_schedule("c", tock, cron="0 * * * *", offset=600)
        await env.create_schedule("c", tock, cron="0 * * * *")
        with pytest.raises(ScheduleRejected, match="an offset goes with every, not with cron"):
            await env.update_schedule("c", offset=300)  # (the owner's: the client sees no cron)
        await env.create_schedule("e", tock, every=3600, offset=600)
        await env.update_schedule("e", cron="0 * * * *")  # (the every's offset goes with it)
        switched = env.describe_schedule("e")
        assert switched.spec is not None and switched.spec.offset_ms == 0
        assert switched.next_fire_ms is not None and switched.next_fire_ms % 3_600_000 == 0


def test_a_cron_schedule_s_offset_made_before_the_rule_carries_over_nowhere() -> None:
    # (a cron spec stored with an offset kept it, unseen, through every update, and a
    # switch to every applied it)
    from runstream.projections.schedule_owner import _spec
    from runstream.projections.schedule_state import ScheduleSpec

    legacy = ScheduleSpec(flow="f", cron="0 * * * *", offset_ms=600_000)
    assert _spec({"every_ms": 3_600_000}, legacy).offset_ms == 0
    assert _spec({"every_ms": 3_600_000, "offset_ms": 5_000}, legacy).offset_ms == 5_000
    assert _spec({"payload_json": "1"}, legacy).offset_ms == 0  # (an update goes through)
    every = ScheduleSpec(flow="f", every_ms=3_600_000, offset_ms=600_000)
    assert _spec({"payload_json": "1"}, every).offset_ms == 600_000
    assert _spec({"cron": "0 * * * *"}, every).offset_ms == 0


async def test_an_interval_is_a_second_or_more_and_the_catch_up_window_shown_is_kept() -> None:
    # (`--every 1ms` made a thousand runs a second; `--catchup-window 0s` showed 0 where
    # the owner keeps 10 s)
    from runstream.engine.readmodel.schedule_view import schedule_lines, schedule_view
    from runstream.projections.schedule_owner import _spec
    from runstream.projections.schedule_state import ScheduleSpec

    async with TestEnvironment([tock], start=START) as env:
        with pytest.raises(InvalidInput, match=r"every must be at least 1 s, not 999 ms"):
            await env.create_schedule("fast", tock, every=0.999)
        await env.create_schedule("s", tock, every=1, catchup_window=0, jitter=0.5)
        with pytest.raises(InvalidInput, match="at least 1 s"):
            await env.update_schedule("s", every=0.01)
        view = schedule_view(env.describe_schedule("s"))
        assert view["catchup_window_ms"] == 10_000
        assert "overlap skip, catch-up window 10 s, jitter 0.5 s" in schedule_lines(view)[0]
    # A spec stored before the rule keeps its interval through a change that names none.
    legacy = ScheduleSpec(flow="f", every_ms=10)
    assert _spec({"payload_json": "1"}, legacy).every_ms == 10
