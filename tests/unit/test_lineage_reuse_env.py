"""A new lineage reusing the id of one whose round 1 was held past its lineage's expiry.

Round 1 of the old lineage `l` is held past the lineage's expiry: its detached spawn's create
request stays unacknowledged in the outbox (a relay that cannot send for a while: the
worker keeps re-sending it, the entry stays), so when round 2 expired alone and then the
lineage expired whole (back to the first gap), round 1 was left behind (projections.
projector._held_rounds). Round 0's tombstone went later, the id `l` was free again, and a
new lineage `l` handed off into `l~1`: it read the old round's journal as its own (its step
never ran), kept its history, and expired within its retention by the old round's settle
key; or, the held round expiring after round 0, its tombstone's going took the new round's
history. Rounds now expire in order (projections.expiry.lineage_eligible)."""

from __future__ import annotations

from typing import Any

from runstream import Flow, FlowContext, Handoff, RunExpired
from runstream.engine.errors import RunstreamError
from runstream.engine.journal import events as ev
from runstream.testing import TestEnvironment

looper: Flow[Any, Any] = Flow("rv74-looper")
kid: Flow[Any, Any] = Flow("rv74-kid")


@kid.handler
async def _kid(ctx: FlowContext, payload: Any) -> Any:
    return "kid"


@looper.handler
async def _looper(ctx: FlowContext, p: dict[str, Any]) -> Any:
    n, mode = p["n"], p["mode"]
    if mode == "old":
        if n == 1:
            await ctx.step("charge", lambda: "charged by the OLD lineage")
            await ctx.spawn(kid, None, detach=True)
        if n < 3:
            return Handoff(payload={"n": n + 1, "mode": mode})
        return "old done"
    # the new lineage: round 0 hands off at once, round 1 is its last
    if n == 0:
        return Handoff(payload={**p, "n": 1})
    if p["sleep"]:
        await ctx.sleep(p["sleep"])
        return "new done"
    return await ctx.step("charge", lambda: "charged by the NEW lineage")


class StuckRelay:
    """The env's relay with the spawn's create request held unsent (unacknowledged), as a
    relay that cannot send for a while holds it."""

    def __init__(self, env: TestEnvironment) -> None:
        self.env, self.stuck = env, True
        self.held: list[Any] = []
        send, decision = env._send_request, env.log.partition_decision

        def _send(item: Any) -> None:
            if self.stuck and item.type == ev.RunCreateRequested.TYPE:
                self.held.append(item)
                return
            send(item)

        def _decision(number: int, cls: Any, **body: Any) -> None:
            if cls is ev.PartitionOutboxSent:
                held = {item.request_id for item in self.held}
                body["request_ids"] = [r for r in body["request_ids"] if r not in held]
                if not body["request_ids"]:
                    return
            decision(number, cls, **body)

        self._send, self._decision = send, decision
        env._send_request = _send  # type: ignore[method-assign]
        env.log.partition_decision = _decision  # type: ignore[method-assign]

    def release(self) -> None:
        self.stuck = False
        items, self.held = self.held, []
        for item in items:
            self._send(item)
        self._decision(0, ev.PartitionOutboxSent, request_ids=[i.request_id for i in items])


async def old_lineage(env: TestEnvironment) -> StuckRelay:
    relay = StuckRelay(env)
    await env.start(looper, {"n": 0, "mode": "old"}, run_id="l")
    assert await env.result("l", follow=True) == "old done"
    assert relay.held, "the spawn's create is held unsent"
    await env.sleep(7)  # (l~2 was expiring alone at 5 s; the lineage (l, l~3) a sweep later)
    return relay


async def start_again(env: TestEnvironment, sleep: float) -> None:
    """Start lineage `l` anew as soon as the id is free (a create retried every 0.5 s)."""
    for _ in range(100):
        try:
            await env.start(looper, {"n": 0, "mode": "new", "sleep": sleep}, run_id="l")
            return
        except RunstreamError:
            await env.sleep(0.5)
    raise AssertionError("never admitted")


async def test_a_new_lineage_never_takes_over_a_held_round_of_an_old_one() -> None:
    async with TestEnvironment([looper, kid], retention=5, tombstone_retention=10) as env:
        relay = await old_lineage(env)
        await env.sleep(11)
        # Held, round 1 holds back the rounds after it and the lineage: nothing expired.
        assert env.projection.store.run("l") is not None
        assert env.projection.store.run("l~2") is not None
        relay.release()  # the old round's spawn is sent at last: the whole lineage goes
        await start_again(env, 0)
        assert await env.result("l", follow=True) == "charged by the NEW lineage"
        [step] = [e for e in env.journal("l~1") if e.kind == "step"]
        assert step.result_json == '"charged by the NEW lineage"'
        await env.sleep(2)  # (well within the new lineage's 5 s retention)
        try:
            env.describe("l")
        except RunExpired as exc:
            raise AssertionError(f"expired within its retention: {exc}") from None


async def test_no_tombstone_of_an_old_round_takes_a_new_round_s_history() -> None:
    async with TestEnvironment([looper, kid], retention=5, tombstone_retention=10) as env:
        relay = await old_lineage(env)
        relay.release()
        await env.sleep(1)
        await start_again(env, 60)
        await env.sleep(0.1)
        before = [(h.offset, h.type) for h in env.history("l~1")]
        assert before, "the new round has a history"
        await env.sleep(15)  # (any tombstone of the old lineage goes)
        assert env.projection.store.run("l~1") is not None
        after = [(h.offset, h.type) for h in env.history("l~1")]
        assert after[: len(before)] == before, "the new round's history was deleted"
