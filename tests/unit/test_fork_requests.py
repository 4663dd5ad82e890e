"""What a fork request says, in the TestEnvironment (the same fork_request the CLI's fork
sends): the user's --force travels with it, whatever the client's read of the source
found (the owner judges the source as it is when the request applies, and refused a fork
the user forced when the source had moved past an irreversible step meanwhile); and a
target id an expired run still holds is refused before anything is sent (its tombstone
refused the first part, and nothing told the caller)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from runstream import Flow, FlowContext, ForkTargetExists
from runstream.engine.journal import events as ev
from runstream.projections.replay import record_of
from runstream.testing import TestEnvironment

once = Flow("fr-once")


@once.handler
async def _once(ctx: FlowContext, payload: Any) -> str:
    return str(await ctx.step("one", str.upper, "one"))


async def test_a_forced_fork_says_so_whatever_the_read_found() -> None:
    async with TestEnvironment([once]) as env:
        source = await env.start(once, None, run_id="src")
        await env.result(source)
        await env.fork(source, at_record=len(env.history(source)), new_run_id="t", force=True)
        [asked] = [record_of(h) for h in env.history(source)
                   if h.type == ev.RunForkRequested.TYPE]
        assert asked.forced is True


async def test_a_fork_into_an_expired_runs_id_is_refused_before_it_is_sent() -> None:
    async with TestEnvironment([once], partitions=2, retention=timedelta(hours=1)) as env:
        await env.run(once, None, run_id="old")
        await env.sleep(5400)  # settled past the retention: expired (at 1 h), its tombstone
        # kept (to 2 h)
        source = await env.start(once, None, run_id="src")
        await env.result(source)
        with pytest.raises(ForkTargetExists, match="expired"):
            await env.fork(source, at_record=len(env.history(source)), new_run_id="old")


big = Flow("fr-big")


def _work(name: str, size: int = 0) -> str:
    return "x" * size if size else name


@big.handler
async def _big(ctx: FlowContext, payload: Any) -> str:
    for i in range(3):  # three parts of a fork's prefix
        await ctx.step(f"bulk-{i}", _work, f"bulk-{i}", 500_000)
    await ctx.wait_for("go")
    return str(await ctx.step("charge", _work, "charge", irreversible=True))


async def test_a_fork_answered_in_part_finishes_whatever_the_source_did_since(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner fails over after the first part; the source then runs an irreversible
    step past the cut. The next owner sends the rest (it refused, for that step: the new
    run stayed half-copied for ever, though the fork had been reported made)."""
    import runstream.engine.testing.env as env_module
    from runstream.projections.fork_transitions import is_copying

    answered = env_module.answer_fork
    calls: list[int] = []

    def first_part_only(*args: Any, **kwargs: Any) -> Any:
        out = answered(*args, **kwargs)
        calls.append(len(out))
        return out[:1] if len(calls) == 1 else out
    monkeypatch.setattr(env_module, "answer_fork", first_part_only)
    async with TestEnvironment([big], partitions=2) as env:
        source = await env.start(big, None, run_id="S")
        await env.run_until_idle()
        target = await env.fork(source, at_record=len(env.history(source)), new_run_id="T")
        await env.run_until_idle()
        assert is_copying(env.describe(target))
        await env.signal(source, "go", 1)
        assert await env.result(source) == "charge"
        env._new_owner()  # a failover: the claim's sweep answers the fork again
        await env.run_until_idle()
        assert not is_copying(env.describe(target)) and env.describe(target).admitted


marked = Flow("fr-marked")
CALLS: list[str] = []


def _called(name: str) -> str:
    CALLS.append(name)
    return name


@marked.handler
async def _marked(ctx: FlowContext, payload: Any) -> list[str]:
    first = await ctx.step("one", _called, "one")
    await ctx.set_attributes({"stage": "charged"})
    return [first, await ctx.step("two", _called, "two")]


async def test_a_forks_prefix_copies_attributes_and_the_steps_after_them() -> None:
    """The prefix stopped at the first set_attributes (or update reply): the steps after it
    ran again in the fork, unforced and unwarned."""
    CALLS.clear()
    async with TestEnvironment([marked], partitions=2) as env:
        source = await env.start(marked, None, run_id="src")
        await env.result(source)
        fork = await env.fork(source, at_record=len(env.history(source)), new_run_id="f")
        assert await env.result(fork) == ["one", "two"]
        assert CALLS == ["one", "two"]  # the source's calls alone
        fork_state = env.describe(fork)
        assert fork_state.fork is not None and fork_state.fork.entry_count == 3
        assert [(a.name, a.value) for a in fork_state.attributes] == [
            ("stage", "charged")]
