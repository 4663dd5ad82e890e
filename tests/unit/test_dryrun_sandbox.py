"""Counterfactual dry run against hand-built journals: no broker, and no step function
ever runs (every step function below counts its calls in CALLS)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from runstream.engine.errors import InvalidInput, StepFailed
from runstream.engine.flow.context import FlowContext, args_digest
from runstream.engine.flow.definition import Flow, Handoff, dump_json
from runstream.engine.timetravel.dryrun import (
    DryRunReport,
    NoDecision,
    dry_run,
    format_dry_run,
    replay_against,
)
from runstream.projections.state import JournalEntry, RunState, RunStatus, Signal, Wait

CALLS: list[str] = []  # every step function call: the dry run must leave it empty
NOW_MS = 1_800_000_000_000
Handler = Callable[[FlowContext, Any], Awaitable[Any]]


@pytest.fixture(autouse=True)
def no_step_runs() -> Iterator[None]:
    CALLS.clear()
    yield
    assert CALLS == [], f"the dry run executed step functions: {CALLS}"


async def charge(amount: int, currency: str) -> str:
    CALLS.append("charge")
    return f"ch-{amount}-{currency}"


async def ship(charge_id: str) -> str:
    CALLS.append("ship")
    return f"sh-{charge_id}"


def notify(charge_id: str, *, channel: str) -> bool:
    CALLS.append("notify")
    return True


def pay_flow(handler: Handler, name: str = "pay", result: Any = dict[str, Any]
             ) -> Flow[Any, Any]:
    flow: Flow[Any, Any] = Flow(name, payload=dict[str, int], result=result)
    flow.handler(handler)
    return flow


async def pay_v1(ctx: FlowContext, payload: dict[str, int]) -> dict[str, Any]:
    charge_id = await ctx.step("charge", charge, payload["amount"], "eur")
    shipment = await ctx.step("ship", ship, charge_id)
    return {"charge": charge_id, "shipment": shipment}


def step(position: int, name: str, result: Any, *args: Any, **kwargs: Any) -> JournalEntry:
    """A completed step entry, with the digest the context journals for these arguments."""
    return JournalEntry(position=position, name=name, status="completed", attempts=1,
                        result_json=json.dumps(result), args_digest=args_digest(args, kwargs))


def run(status: RunStatus = RunStatus.completed, *, flow: str = "pay",
        payload: Any = None, **fields: Any) -> RunState:
    return RunState(run_id="r1", lineage_id="r1", partition=0, flow=flow,
                    payload_json=dump_json(payload if payload is not None else {"amount": 5}),
                    request_id="q1", request_offset=0, created_at_ms=0, updated_at_ms=0,
                    status=status, **fields)


PAID = (step(0, "charge", "ch-5-eur", 5, "eur"), step(1, "ship", "sh-ch-5-eur", "ch-5-eur"))
PAID_RESULT = '{"charge":"ch-5-eur","shipment":"sh-ch-5-eur"}'


async def dry(handler: Handler, state: RunState, entries: tuple[JournalEntry, ...],
              result: Any = dict[str, Any], **options: Any) -> DryRunReport:
    flow = pay_flow(handler, state.flow, result)
    return await replay_against(flow, state, entries, now_ms=NOW_MS, **options)


async def test_unchanged_code_reports_no_difference() -> None:
    report = await dry(pay_v1, run(result_json=PAID_RESULT), PAID)
    assert report.difference is None
    assert report.same == 2
    assert report.next.kind == "completed" and report.next.value == PAID_RESULT
    assert format_dry_run(report)[0] == (
        "no difference: the new code makes the same 2 decisions and would next complete the "
        f"run with result {PAID_RESULT}")


async def test_the_report_as_json_names_both_sides_of_the_difference() -> None:
    async def in_dollars(ctx: FlowContext, payload: dict[str, int]) -> dict[str, Any]:
        return {"charge": await ctx.step("charge", charge, payload["amount"], "usd")}

    report = json.loads(json.dumps((await dry(in_dollars, run(RunStatus.running), PAID))
                                   .as_dict()))
    assert report["difference"]["reason"] == "other arguments"
    assert report["difference"]["original"]["args_digest"] == PAID[0].args_digest
    assert report["difference"]["new"]["args_digest"] == args_digest((5, "usd"), {})
    assert report["next"]["kind"] == "completed" and report["same"] == 0
    assert (report["run_id"], report["flow"], report["status"]) == ("r1", "pay", "running")


async def test_a_renamed_step_is_another_step_and_the_run_would_fail() -> None:
    async def renamed(ctx: FlowContext, payload: dict[str, int]) -> dict[str, Any]:
        charge_id = await ctx.step("charge_v2", charge, payload["amount"], "eur")
        return {"charge": charge_id}

    report = await dry(renamed, run(result_json=PAID_RESULT), PAID)
    difference = report.difference
    assert difference is not None
    assert (difference.reason, difference.position) == ("another step", 0)
    assert (difference.original.name, difference.new.name) == ("charge", "charge_v2")
    assert report.next.kind == "failed" and report.next.name == "NonDeterminism"
    lines = format_dry_run(report)
    digest = args_digest((5, "eur"), {})
    assert lines[0] == (
        f"first difference at position 0 (another step): original step 'charge'(args "
        f"{digest}) at position 0 -> new code step 'charge_v2'(args {digest}: 5, 'eur') at "
        f"position 0")
    assert lines[1].startswith("next: fail the run with NonDeterminism: ")


async def test_other_arguments_are_reported_and_the_replay_goes_on() -> None:
    async def in_dollars(ctx: FlowContext, payload: dict[str, int]) -> dict[str, Any]:
        charge_id = await ctx.step("charge", charge, payload["amount"], "usd")
        shipment = await ctx.step("ship", ship, charge_id)
        return {"charge": charge_id, "shipment": shipment}

    report = await dry(in_dollars, run(result_json=PAID_RESULT), PAID)
    difference = report.difference
    assert difference is not None
    assert (difference.reason, difference.position) == ("other arguments", 0)
    assert difference.original.args_digest == args_digest((5, "eur"), {})
    assert difference.new.args_digest == args_digest((5, "usd"), {})
    assert "5, 'usd'" in difference.new.text
    # A worker's replay returns the journaled results: the run still completes the same way.
    assert report.next.kind == "completed" and report.next.value == PAID_RESULT


async def test_keyword_arguments_count_in_the_digest() -> None:
    assert args_digest((1,), {"a": 1, "b": 2}) == args_digest((1,), {"b": 2, "a": 1})
    assert args_digest((1,), {"a": 1}) != args_digest((1,), {"a": 2})
    assert args_digest((1,), {}) != args_digest((), {"x": 1})
    assert len(args_digest((object(),), {})) == 16  # JSON cannot hold it: its repr counts


async def test_another_result_from_the_same_step_results() -> None:
    async def reshaped(ctx: FlowContext, payload: dict[str, int]) -> dict[str, Any]:
        charge_id = await ctx.step("charge", charge, payload["amount"], "eur")
        await ctx.step("ship", ship, charge_id)
        return {"charge": charge_id, "shipped": True}

    report = await dry(reshaped, run(result_json=PAID_RESULT), PAID)
    difference = report.difference
    assert difference is not None
    assert (difference.reason, difference.position) == ("another result", None)
    assert difference.original.value == PAID_RESULT
    assert difference.new.value == '{"charge":"ch-5-eur","shipped":true}'
    assert format_dry_run(report)[0].startswith("first difference at the end (another result)")


async def test_an_extra_step_at_the_end_is_the_intent_and_does_not_run() -> None:
    async def notifies(ctx: FlowContext, payload: dict[str, int]) -> dict[str, Any]:
        result = await pay_v1(ctx, payload)
        await ctx.step("notify", notify, result["charge"], channel="mail")
        return result

    report = await dry(notifies, run(result_json=PAID_RESULT), PAID)
    difference = report.difference
    assert difference is not None
    assert (difference.reason, difference.position) == ("goes further", 2)
    assert difference.original.kind == "completed"
    assert report.next.kind == "step" and report.next.name == "notify"
    assert report.next.arguments == "'ch-5-eur', channel='mail'"
    assert report.next.args_digest == args_digest(("ch-5-eur",), {"channel": "mail"})
    assert report.next.action == (
        f"run step 'notify'(args {report.next.args_digest}: 'ch-5-eur', channel='mail') at "
        f"position 2")


async def test_fewer_steps_end_earlier() -> None:
    async def no_shipping(ctx: FlowContext, payload: dict[str, int]) -> dict[str, Any]:
        charge_id = await ctx.step("charge", charge, payload["amount"], "eur")
        return {"charge": charge_id, "shipment": None}

    report = await dry(no_shipping, run(result_json=PAID_RESULT), PAID)
    difference = report.difference
    assert difference is not None
    assert (difference.reason, difference.position) == ("ends earlier", 1)
    assert difference.original.name == "ship"
    assert difference.new.kind == "completed"
    assert report.same == 1


async def test_an_unfinished_run_goes_on_with_its_next_step() -> None:
    report = await dry(pay_v1, run(RunStatus.running), PAID[:1])
    assert report.difference is None
    assert report.next.kind == "step" and report.next.name == "ship"
    assert report.next.position == 1


async def test_a_retrying_step_would_run_again_without_a_difference() -> None:
    retrying = JournalEntry(position=1, name="ship", status="retrying", attempts=1,
                            error_type="IOError", args_digest=args_digest(("ch-5-eur",), {}))
    report = await dry(pay_v1, run(RunStatus.pending), (PAID[0], retrying))
    assert report.difference is None
    assert report.next.action.startswith("run step 'ship'")


async def test_journals_without_digests_compare_names_only() -> None:
    old = tuple(JournalEntry(position=e.position, name=e.name, status=e.status, attempts=1,
                             result_json=e.result_json) for e in PAID)
    report = await dry(pay_v1, run(result_json=PAID_RESULT), old)
    assert report.difference is None


async def test_concurrent_new_steps_run_nothing() -> None:
    async def fan_out(ctx: FlowContext, payload: dict[str, int]) -> list[str]:
        return list(await asyncio.gather(ctx.step("a", charge, 1, "eur"),
                                         ctx.step("b", charge, 2, "eur")))

    report = await dry(fan_out, run(RunStatus.running), ())
    assert report.next.kind == "step" and report.next.name == "a"
    await asyncio.sleep(0.01)  # the second task, if it went on, would have run by now


async def approve_flow(ctx: FlowContext, payload: dict[str, int]) -> dict[str, Any]:
    charge_id = await ctx.step("charge", charge, payload["amount"], "eur")
    decision = await ctx.wait_for("approve")
    await ctx.sleep(60)
    return {"charge": charge_id, "approved": decision}


WAITING = JournalEntry(position=1, name="approve", kind="wait", status="waiting")
APPROVED = JournalEntry(position=1, name="approve", kind="wait", status="completed",
                        attempts=1, result_json="true")
SLEPT = JournalEntry(position=2, name="sleep", kind="sleep", status="completed", attempts=1,
                     result_json="null", due_ms=NOW_MS - 1000)


async def test_a_run_waiting_for_a_signal_would_wait_for_it_still() -> None:
    state = run(RunStatus.suspended, suspended_reason="event",
                wait=Wait(kind="event", position=1, event_name="approve"))
    report = await dry(approve_flow, state, (PAID[0], WAITING))
    assert report.difference is None
    assert report.same == 2
    assert report.next.action == "wait for signal 'approve' at position 1"


async def test_a_buffered_signal_is_what_it_would_take_next() -> None:
    state = run(RunStatus.pending, signals=(Signal("s1", "approve", "true", 7),))
    report = await dry(approve_flow, state, (PAID[0], WAITING))
    assert report.difference is None
    assert report.next.action == "take the buffered signal 'approve' at position 1"


async def test_waits_replay_from_their_entries() -> None:
    result = '{"approved":true,"charge":"ch-5-eur"}'
    report = await dry(approve_flow, run(result_json=result), (PAID[0], APPROVED, SLEPT))
    assert report.difference is None and report.same == 3
    assert report.next.kind == "completed"


async def test_a_sleep_the_old_code_did_not_have_is_the_intent() -> None:
    state = run(RunStatus.suspended, wait=Wait(kind="event", position=1, event_name="approve"))

    async def sleeps_first(ctx: FlowContext, payload: dict[str, int]) -> None:
        await ctx.step("charge", charge, payload["amount"], "eur")
        await ctx.sleep(30)

    report = await dry(sleeps_first, state, (PAID[0], WAITING))
    difference = report.difference
    assert difference is not None
    assert (difference.reason, difference.position) == ("another step", 1)
    assert (difference.original.kind, difference.new.kind) == ("wait", "sleep")


async def test_a_new_wait_at_the_end_is_would_wait() -> None:
    async def waits_more(ctx: FlowContext, payload: dict[str, int]) -> dict[str, Any]:
        result = await pay_v1(ctx, payload)
        await ctx.wait_for("confirm", timeout=60)
        return result

    report = await dry(waits_more, run(result_json=PAID_RESULT), PAID)
    assert report.difference is not None and report.difference.reason == "goes further"
    assert report.next.kind == "wait"
    assert report.next.action.startswith("wait for signal 'confirm' (timeout ")


async def test_a_cancelled_run_is_cancelled_again() -> None:
    state = run(RunStatus.cancelled, cancel_requested="operator", error_type="RunCancelled",
                error_message="operator")
    report = await dry(approve_flow, state, (PAID[0], WAITING))
    assert report.difference is None
    assert report.next.kind == "cancelled"


async def test_a_failed_step_handled_by_new_code_is_another_status() -> None:
    failed = JournalEntry(position=0, name="charge", status="failed", attempts=3,
                          error_type="IOError", error_message="bank down",
                          args_digest=args_digest((5, "eur"), {}))
    message = str(StepFailed("charge", "IOError", "bank down", 3))
    state = run(RunStatus.failed, error_type="StepFailed", error_message=message)
    same = await dry(pay_v1, state, (failed,))
    assert same.difference is None and same.next.kind == "failed"

    async def tolerant(ctx: FlowContext, payload: dict[str, int]) -> dict[str, Any]:
        try:
            return await pay_v1(ctx, payload)
        except StepFailed:
            return {"charge": None}

    report = await dry(tolerant, state, (failed,))
    assert report.difference is not None and report.difference.reason == "another status"
    assert report.next.kind == "completed"


async def test_a_quarantined_run_stays_quarantined() -> None:
    started = JournalEntry(position=1, name="ship", status="started", irreversible=True)

    async def irreversible(ctx: FlowContext, payload: dict[str, int]) -> str:
        charge_id = await ctx.step("charge", charge, payload["amount"], "eur")
        return await ctx.step("ship", ship, charge_id, irreversible=True)

    state = run(RunStatus.suspended, suspended_reason="quarantine",
                wait=Wait(kind="quarantine", position=1))
    report = await dry(irreversible, state, (PAID[0], started))
    assert report.difference is None and report.next.kind == "quarantined"


async def test_a_handoff_with_another_payload_is_another_result() -> None:
    async def hands_off(ctx: FlowContext, payload: dict[str, int]) -> Handoff:
        await ctx.step("charge", charge, payload["amount"], "eur")
        return Handoff(payload={"amount": payload["amount"] + 1})

    state = run(handed_off_to="r1~1", result_json='{"handed_off_to":"r1~1","round":1}')
    following = run(RunStatus.pending, payload={"amount": 6})
    same = await dry(hands_off, state, PAID[:1], next_round=following)
    assert same.difference is None and same.next.kind == "handed-off"
    other = await dry(hands_off, state, PAID[:1],
                      next_round=run(RunStatus.pending, payload={"amount": 9}))
    assert other.difference is not None and other.difference.reason == "another result"


async def test_spawns_and_child_results_replay_from_their_entries() -> None:
    async def parent(ctx: FlowContext, payload: dict[str, int]) -> Any:
        child = await ctx.spawn("child", {"n": 1})
        return await child.result()

    spawned = JournalEntry(position=0, name="child", kind="spawn", status="completed",
                           attempts=1, result_json='"r1.0"', child_status="completed")
    joined = JournalEntry(position=1, name="r1.0", kind="child", status="completed",
                          attempts=1, result_json="42")
    report = await dry(parent, run(result_json="42"), (spawned, joined), result=int)
    assert report.difference is None and report.same == 2
    fresh = await dry(parent, run(RunStatus.running), (), result=int)
    assert fresh.next.kind == "spawn"
    assert fresh.next.action == ("spawn child 'r1.0' of flow 'child' with payload "
                                 "{\"n\":1} at position 0")


async def test_a_handler_awaiting_outside_its_context_is_stopped() -> None:
    async def stuck(ctx: FlowContext, payload: dict[str, int]) -> None:
        await asyncio.Event().wait()

    with pytest.raises(NoDecision, match="no decision within"):
        await dry(stuck, run(RunStatus.running), (), timeout=0.2)


async def test_dry_run_needs_flow_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNSTREAM_APP", raising=False)
    with pytest.raises(InvalidInput, match="--app"):
        await dry_run(bootstrap=None, namespace=None, run_id="r1", app=None)


async def test_a_patched_deploy_replays_old_runs_on_their_old_branch() -> None:
    async def patched(ctx: FlowContext, payload: dict[str, int]) -> dict[str, Any]:
        currency = "usd" if ctx.patched("dollars") else "eur"
        charge_id = await ctx.step("charge", charge, payload["amount"], currency)
        shipment = await ctx.step("ship", ship, charge_id)
        return {"charge": charge_id, "shipment": shipment}

    old = await dry(patched, run(result_json=PAID_RESULT), PAID)
    assert old.difference is None and old.same == 2
    fresh = await dry(patched, run(RunStatus.running), ())
    assert fresh.difference is None
    assert fresh.next.action == "write patch marker 'dollars' (the new branch) at position 0"


def test_a_wait_out_of_a_retry_backoff_and_a_timed_child_wait_say_what_they_are() -> None:
    """A run waiting out a durable retry backoff was shown as "would next wait for child
    None" (the CLI, --json and the UI)."""
    from runstream.engine.timetravel.dryrun_report import wait_intent
    backoff = wait_intent(None, Wait(kind="retry", position=1, due_ms=1_767_225_630_000))
    assert backoff.action == ("wait out a retry backoff until 2026-01-01T00:00:30+00:00 "
                              "at position 1")
    child = wait_intent(None, Wait(kind="child", position=2, child_run_id="k",
                                   due_ms=1_767_225_630_000))
    assert child.action == "wait for child 'k' (timeout 2026-01-01T00:00:30+00:00) at position 2"
