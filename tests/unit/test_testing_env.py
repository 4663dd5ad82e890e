"""runstream.engine.testing: users' flows run in-process through the engine's reducer, context and
decisions, with a virtual clock. No broker."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from runstream import (
    ChildCancelled,
    ChildFailed,
    Flow,
    FlowContext,
    ResumeRefused,
    RunCancelled,
    RunFailed,
    RunStatus,
    SignalRefused,
    WaitTimeout,
)
from runstream.engine.demo.flows import checkout
from runstream.engine.journal import events as ev
from runstream.engine.testing import EnvironmentIdle, TestEnvironment
from runstream.projections.fork_plan import ForkNeedsForce
from runstream.projections.state import Verdict, incarnation_id
from tests.integration.fork_flows import calls, counted, family, risky
from tests.integration.fork_flows import flows as fork_flows
from tests.integration.waiting_flows import (
    approval,
    cleanup,
    collector,
    cycle,
    flows,
    guarded,
    parent,
    sleeper,
    tree,
)

month = Flow("month")


@month.handler
async def _month(ctx: FlowContext, payload: Any) -> dict[str, Any]:
    await ctx.sleep(timedelta(days=30))
    try:
        approved = await ctx.wait_for("approval", timeout=timedelta(days=2))
    except WaitTimeout:
        approved = None
    return {"approved": approved, "at": (await ctx.now()).isoformat()}


def types(env: TestEnvironment, run_id: str) -> list[str]:
    return [item.record.TYPE for item in env.history(run_id) if item.record is not None]


async def test_a_flow_that_sleeps_30_days_and_waits_for_a_signal_takes_milliseconds() -> None:
    started = time.perf_counter()
    async with TestEnvironment([month]) as env:
        run_id = await env.start(month, None, run_id="m")
        await env.sleep(timedelta(days=30, hours=1))  # the 30-day timer fires on the way
        assert env.describe(run_id).wait is not None
        assert env.describe(run_id).wait.kind == "event"  # type: ignore[union-attr]
        await env.signal(run_id, "approval", {"by": "ops"})
        result = await env.result(run_id)
    assert result == {"approved": {"by": "ops"}, "at": "2026-01-31T01:00:00+00:00"}
    assert time.perf_counter() - started < 1.0


async def test_time_skips_to_the_next_timer_when_every_run_waits() -> None:
    async with TestEnvironment([month]) as env:
        result = await env.run(month, None)  # nobody signals: the 2-day timeout fires
        assert result == {"approved": None, "at": "2026-02-02T00:00:00+00:00"}
        assert env.now.isoformat() == "2026-02-02T00:00:00+00:00"


async def test_signals_before_the_wait_duplicates_and_order() -> None:
    async with TestEnvironment(flows) as env:
        run_id = await env.start(collector, {"count": 2})
        await env.signal(run_id, "item", "first", request_id="a")
        await env.signal(run_id, "item", "first again", request_id="a")  # delivered once
        await env.signal(run_id, "item", "second", request_id="b")
        assert await env.result(run_id) == ["first", "second"]
        verdicts = [i.verdict for i in env.history(run_id)
                    if isinstance(i.record, ev.RunSignalSent)]
        assert verdicts == [Verdict.applied, Verdict.duplicate, Verdict.applied]
        with pytest.raises(SignalRefused, match="ended"):
            await env.signal(run_id, "item", "late")


async def test_signal_buffer_is_bounded() -> None:
    async with TestEnvironment(flows) as env:
        run_id = await env.start(collector, {"count": 1})
        for i in range(64):
            await env.signal(run_id, "other", i)
        with pytest.raises(SignalRefused, match="64"):
            await env.signal(run_id, "other", 64)


async def test_wait_timeout_and_operator_resume() -> None:
    async with TestEnvironment(flows) as env:
        assert await env.run(approval, {"timeout": 60}) == "timed out"
        napping = await env.start(sleeper, {"seconds": 10 * 24 * 3600})
        waiting = await env.start(approval, {"timeout": None})
        await env.run_until_idle()
        before = env.now
        await env.resume(napping)
        await env.resume(waiting)
        assert await env.result(napping) == "slept"
        assert await env.result(waiting) == "timed out"
        assert env.now == before  # woken early: no time passed
        resumed = [i.record for i in env.history(napping) if isinstance(i.record, ev.RunResumed)]
        assert [r.reason for r in resumed] == ["operator"]
        with pytest.raises(ResumeRefused, match=r"not waiting|ended"):
            await env.resume(napping)


def kid(env: TestEnvironment, run_id: str, *positions: int) -> str:
    """The default id of the child spawned at each position in turn, from `run_id` down:
    its parent's id with the parent's incarnation, then the spawn's position."""
    for position in positions:
        run_id = f"{incarnation_id(env.describe(run_id))}.{position}"
    return run_id


async def test_children_results_failures_and_exit_policy() -> None:
    specs = [{"payload": {"value": "a"}}, {"payload": {"fail": True}},
             {"payload": {"sleep": 3600}}, {"payload": {"sleep": 60, "value": "d"},
                                            "detach": True}]
    async with TestEnvironment(flows, partitions=4) as env:
        result = await env.run(parent, {"children": specs, "await": [0, 1]}, run_id="p")
        p0, p1, p2, p3 = (kid(env, "p", n) for n in range(4))
        assert p0.startswith("p@") and p0.endswith(".0")  # the parent's incarnation, position
        assert result["results"] == {p0: "a", p1: "failed: ValueError"}
        [policy] = [i.record for i in env.history("p")
                    if isinstance(i.record, ev.ChildPolicyApplied)]
        assert (policy.cancelled, policy.detached) == ([p2], [p3])
        await env.sleep(120)
        assert env.status(p2) is RunStatus.cancelled
        assert await env.result(p3) == "d"
        assert {env.describe(c).partition for c in (p0, p1, p2, p3)} != {0}


async def test_a_failed_child_raises_child_failed_in_its_parent() -> None:
    strict = Flow("strict")

    @strict.handler
    async def _strict(ctx: FlowContext, payload: Any) -> Any:
        kid = await ctx.spawn("child", {"fail": True})
        return await kid.result()

    async with TestEnvironment([*flows, strict]) as env:
        with pytest.raises(RunFailed, match="ChildFailed") as caught:
            await env.run(strict, None, run_id="s")
        assert "ValueError" in str(caught.value)
        assert ChildFailed.__name__ in (env.describe("s").error_type or "")


async def test_cancel_pending_running_suspended_and_a_tree() -> None:
    async with TestEnvironment(flows, partitions=3, concurrency=1) as env:
        # Pending: the one slot is marked for the first run (as a worker's would be held).
        ahead = await env.start(sleeper, {"seconds": 1})
        pending = await env.start(sleeper, {"seconds": 1})
        assert (env.describe(ahead).status, env.describe(pending).status) == (
            RunStatus.running, RunStatus.pending)  # (the first activated in its run.created)
        await env.cancel(pending, reason="no")
        with pytest.raises(RunCancelled, match="no"):
            await env.result(pending)
        assert env.describe(pending).activations == 0
        parked = await env.start(cleanup, {"wait": True})
        await env.run_until_idle()
        await env.cancel(parked)
        with pytest.raises(RunCancelled):
            await env.result(parked)
        assert env.journal(parked)[-1].name == "cleanup"  # its finally block ran
        root = await env.start(tree, {"depth": 2, "fanout": 2}, run_id="root")
        await env.run_until_idle()
        await env.cancel(root, reason="tear down")
        with pytest.raises(RunCancelled):
            await env.result(root)
        await env.run_until_idle()
        family = [kid(env, "root", *path) for path in ((0,), (1,), (0, 0), (0, 1), (1, 0),
                                                        (1, 1))]
        assert {env.status(r) for r in family} == {RunStatus.cancelled}


async def test_spawn_cycle_is_detected() -> None:
    async with TestEnvironment(flows) as env:
        with pytest.raises(RunFailed, match="root -> mid -> root"):
            await env.run(cycle, {"spawn_as": "mid"}, run_id="root")


async def test_a_crash_injected_at_a_position_replays_from_the_journal() -> None:
    calls: list[str] = []
    counted = Flow("counted")

    @counted.handler
    async def _counted(ctx: FlowContext, payload: Any) -> int:
        total = 0
        for name in ("a", "b", "c"):
            total += await ctx.step(name, lambda n=name: calls.append(n) or len(calls))
        return total

    async with TestEnvironment([counted]) as env:
        env.crash_at("r", 1)  # b's completion is lost with the worker
        assert await env.run(counted, None, run_id="r") == 1 + 3 + 4
        assert calls == ["a", "b", "b", "c"]  # b ran again, a did not
        assert env.crashes == 1
        modes = [i.record.mode for i in env.history("r") if isinstance(i.record, ev.RunActivated)]
        # The first activation rode in its run.created, as a worker's does; the new owner's
        # is a record of its own.
        assert modes == ["stolen"]
        [created] = [i.record for i in env.history("r") if isinstance(i.record, ev.RunCreated)]
        assert created.activated


async def test_idle_environment_says_what_runs_wait_for() -> None:
    async with TestEnvironment(flows) as env:
        with pytest.raises(EnvironmentIdle, match="signal 'approval'"):
            await env.run(approval, {"timeout": None})


async def test_the_demo_checkout_flow() -> None:
    async with TestEnvironment([checkout]) as env:
        result = await env.run(checkout, {"order_id": "o1", "amount": 5}, run_id="o1")
        assert result.reservation == "res-o1-5" and result.receipt.startswith("receipt for ch-o1")
        assert [e.name for e in env.journal("o1")] == ["reserve", "charge", "receipt"]
        assert types(env, "o1")[-1] == ev.RunCompleted.TYPE


async def test_pytest_fixture(runstream_env: Callable[..., TestEnvironment]) -> None:
    env = runstream_env(flows)
    assert await env.run(sleeper, {"seconds": 3600}) == "slept"


async def test_a_finally_block_runs_once_when_the_handler_really_ends() -> None:
    async with TestEnvironment(flows) as env:
        run_id = await env.start(guarded, {"seconds": 60})
        await env.sleep(120)
        await env.signal(run_id, "go")
        assert await env.result(run_id) == "done"
        assert [e.name for e in env.journal(run_id)] == ["sleep", "go", "after", "cleanup"]


async def test_a_child_id_that_exists_already_fails_the_second_parents_spawn() -> None:
    """Two parents naming the same child id: the second must not wait forever for a child
    that will only ever wake the first."""
    twin = Flow("twin")

    @twin.handler
    async def _twin(ctx: FlowContext, payload: Any) -> Any:
        kid = await ctx.spawn("child", {"value": "shared"}, run_id="shared")
        try:
            return await kid.result()
        except ChildFailed as exc:
            return f"{exc.error_type}: {exc.message}"

    async with TestEnvironment([*flows, twin], partitions=3) as env:
        assert await env.run(twin, None, run_id="a") == "shared"
        refused = await env.run(twin, None, run_id="b")
        assert refused.startswith("SpawnRefused: run shared already exists with parent 'a'")
        assert env.describe("b").children == ()


async def test_a_child_spawned_while_its_parent_is_cancelled_is_cancelled_at_once() -> None:
    late = Flow("late")

    @late.handler
    async def _late(ctx: FlowContext, payload: Any) -> Any:
        try:
            await ctx.wait_for("never")
        finally:
            kid = await ctx.spawn("child", {"sleep": 3600}, detach=True)  # linked anyway
            try:
                await kid.result()
            except ChildCancelled:
                await ctx.step("noted", lambda: "child cancelled")

    async with TestEnvironment([*flows, late], partitions=2) as env:
        run_id = await env.start(late, None, run_id="late")
        await env.run_until_idle()
        await env.cancel(run_id, reason="stop")
        with pytest.raises(RunCancelled):
            await env.result(run_id)
        assert env.status(kid(env, "late", 1)) is RunStatus.cancelled
        assert [e.name for e in env.journal(run_id)][-1] == "noted"
        assert env.now.isoformat().startswith("2026-01-01")  # no hour-long sleep waited out


async def test_a_quarantined_run_is_cancelled_without_running() -> None:
    risky = Flow("risky")

    @risky.handler
    async def _risky(ctx: FlowContext, payload: Any) -> Any:
        def charge() -> None:
            raise TimeoutError("the card network did not answer")

        return await ctx.step("charge", charge, irreversible=True)

    async with TestEnvironment([risky]) as env:
        run_id = await env.start(risky, None)
        await env.run_until_idle()
        run = env.describe(run_id)
        assert run.status is RunStatus.suspended and run.wait is not None
        assert run.wait.kind == "quarantine"
        with pytest.raises(ResumeRefused, match="quarantined"):
            await env.resume(run_id)
        await env.cancel(run_id, reason="refunded by hand")
        with pytest.raises(RunCancelled, match="refunded by hand"):
            await env.result(run_id)
        assert env.describe(run_id).activations == 1  # not run again to be cancelled


async def test_handoff_rounds_and_a_quarantine_resolution_in_the_environment() -> None:
    from runstream import HandedOff, Handoff
    from runstream.engine.flow.context import idempotency_key

    relay = Flow("relay-env", max_rounds=3)

    @relay.handler
    async def _relay(ctx: FlowContext, n: int) -> Any:
        return Handoff(payload=n + 1) if n < 5 else n

    charged: list[str] = []
    risky = Flow("risky-env")

    @risky.handler
    async def _risky(ctx: FlowContext, payload: Any) -> Any:
        def charge() -> str:
            charged.append(idempotency_key())
            raise TimeoutError("no answer from the bank")

        return await ctx.step("charge", charge, irreversible=True)

    async with TestEnvironment([relay, risky]) as env:
        run_id = await env.start(relay, 0, run_id="relay")
        assert await env.result(run_id) == HandedOff("relay~1", 1)
        with pytest.raises(RunFailed, match="LineageExhausted: round 2 handed off past the "
                                            "lineage's budget of 3 rounds: no round 3"):
            await env.result(run_id, follow=True)
        risky_id = await env.start(risky, None, run_id="risky")
        await env.run_until_idle()
        wait = env.describe(risky_id).wait
        assert wait is not None and wait.kind == "quarantine" and wait.digest
        with pytest.raises(ResumeRefused, match="digest"):
            await env.resume(risky_id, resolution="skip", position=wait.position,
                             digest="stale", result="x")
        await env.resume(risky_id, resolution="skip", position=wait.position,
                         digest=wait.digest, result="refunded by hand")
        assert await env.result(risky_id) == "refunded by hand"
        assert charged == ["risky/0"]  # skipped: not run again


async def test_a_fork_replays_its_copied_prefix_and_runs_the_rest_once_more() -> None:
    async with TestEnvironment(fork_flows, partitions=2) as env:
        source = await env.start(counted, {"tag": "env-fork"}, run_id="src")
        expected = await env.result(source)
        at = types(env, source).index("step.completed") + 2  # after the second step
        forked = await env.fork(source, at_record=at, new_run_id="forked")
        assert await env.result(forked) == expected
        assert calls("env-fork") == {"one": 1, "two": 1, "three": 2, "four": 2}
        assert types(env, forked)[:4] == ["run.fork-part", "run.forked",
                                           "journal.entry-copied", "journal.entry-copied"]
        state = env.describe(forked)
        assert state.fork is not None and (state.fork.source_record, state.steps) == (at, 4)

        await env.run(risky, {"tag": "env-risky"}, run_id="pay")
        with pytest.raises(ForkNeedsForce, match="irreversible step 'charge'"):
            await env.fork("pay", at_record=4)
        again = await env.fork("pay", at_record=4, force=True)
        await env.result(again)
        assert calls("env-risky") == {"prepare": 1, "charge": 2, "receipt": 2}

        await env.run(family, {"tag": "env-kin"}, run_id="kin")
        # Forked at its last record, the completion, which carries its last step
        # (engine.flow.held): the spawn (its child finished), the child's result and that
        # step are copied, so nothing spawns or runs again.
        assert env.history("kin")[-1].type == "run.completed"
        at_after = len(env.history("kin"))
        tail = await env.fork("kin", at_record=at_after)
        await env.result(tail)
        assert calls("env-kin") == {"before": 1, "child-work": 1, "after": 1}
        assert env.describe(tail).fork is not None


async def test_a_cancel_of_a_settled_run_and_a_signal_to_none_raise_as_a_client_s_do() -> None:
    """env.cancel of a completed run returned (its verdict was refused: a Client raises
    CancelRefused), and env.signal to a run that does not exist returned (RunNotFound)."""
    from runstream import CancelRefused, Flow, RunNotFound

    quick: Flow[Any, Any] = Flow("env-quick")

    @quick.handler
    async def _quick(ctx: FlowContext, payload: Any) -> Any:
        return payload

    async with TestEnvironment([quick]) as env:
        assert await env.run(quick, 1, run_id="q") == 1
        with pytest.raises(CancelRefused, match="has ended"):
            await env.cancel("q", reason="late")
        with pytest.raises(RunNotFound):
            await env.signal("nobody", "go")


async def test_requests_naming_round_zero_and_a_reused_start_id_as_a_client_s() -> None:
    """`<lineage>~0` reaches round 0 while it lives and is refused once it handed off (it
    reached nothing: verdict ignored); a signal-with-start whose request id was another
    run's returned its run id, and no run existed."""
    from runstream import CancelRefused, SignalRefused
    from tests.integration.test_requests_during_handoffs import waiter as waits

    async with TestEnvironment([waits]) as env:
        await env.start(waits, None, run_id="a")
        await env.run_until_idle()
        await env.signal("a~0", "go", "went")
        assert await env.result("a") == "went"
        await env.start(waits, "hand off", run_id="h")
        await env.run_until_idle()
        with pytest.raises(CancelRefused, match="has ended"):
            await env.cancel("h~0")
        await env.signal_with_start(waits, None, run_id="s", signal="go", request_id="shared")
        with pytest.raises(SignalRefused, match="'shared' was used before"):
            await env.signal_with_start(waits, None, run_id="t", signal="go",
                                        request_id="shared")
