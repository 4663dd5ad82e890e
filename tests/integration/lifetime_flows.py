"""Flows for issue 16's whole-life tests: limits of runs created by name, children that
hand off, cleanup that waits after a cancel, and handlers that swallow the cancel. Used by
the TestEnvironment tests (tests/unit/test_lifetime_env.py) and the broker tests
(tests/integration/test_lifetime.py): the same scenarios through both."""

from __future__ import annotations

from typing import Any

from runstream import Cancelled, Flow, FlowContext, Handoff

capped = Flow("h-capped", capabilities={"payments.read"})
looper = Flow("h-looper", max_rounds=3)
hopper = Flow("h-hopper")
hopper_parent = Flow("h-hopper-parent")
tidy = Flow("h-tidy")
swallower = Flow("h-swallower")
mover = Flow("h-mover")
waiting_kid = Flow("h-waiting-kid")
careful = Flow("h-careful")

# What the cleanup and charge steps did, per run id (steps record it here, so a test can
# tell a step that ran from one that was replayed). Test-only: cleared by each test.
EFFECTS: dict[str, list[str]] = {}


def effect(run_id: str, what: str) -> str:
    EFFECTS.setdefault(run_id, []).append(what)
    return what


@capped.handler
async def _capped(ctx: FlowContext, payload: Any) -> str:
    try:
        return await ctx.step("charge", lambda: effect(ctx.run_id, "charge"),
                              requires="payments.charge")
    except Exception:  # a fallback that catches the refusal: the run fails all the same
        if not (payload or {}).get("fallback"):
            raise
        return "fell back"


@mover.handler
async def _mover(ctx: FlowContext, payload: Any) -> Handoff:
    """Hands off to h-capped by name (an owner may lack it: a rolling deploy)."""
    return Handoff(flow="h-capped", payload=payload)


@looper.handler
async def _looper(ctx: FlowContext, payload: Any) -> Handoff:
    n = await ctx.step("count", lambda: int(payload["n"]))
    return Handoff(payload={"n": n + 1})


@hopper.handler
async def _hopper(ctx: FlowContext, payload: Any) -> Any:
    """Hands off until round `to`, then returns its total."""
    n = await ctx.step("count", lambda: int(payload["n"]))
    if n < int(payload["to"]):
        return Handoff(payload={"n": n + 1, "to": payload["to"]})
    return {"rounds": n, "total": n * 10}


@hopper_parent.handler
async def _hopper_parent(ctx: FlowContext, payload: Any) -> Any:
    child = await ctx.spawn(hopper, {"n": 0, "to": payload["to"]})
    return {"child": await child.result()}


@tidy.handler
async def _tidy(ctx: FlowContext, payload: Any) -> str:
    """Waits for a signal that never comes; its cleanup waits durably, then steps."""
    try:
        await ctx.wait_for("never")
        return "not reached"
    finally:
        await ctx.sleep(float(payload.get("cleanup_sleep", 1)))
        await ctx.step("cleanup", lambda: effect(ctx.run_id, "cleanup"))


@swallower.handler
async def _swallower(ctx: FlowContext, payload: Any) -> Any:
    """Catches the cancel and returns as if nothing happened (or hands off)."""
    try:
        await ctx.wait_for("never")
    except Cancelled:
        return Handoff(payload=None) if payload == "handoff" else "ignored the cancel"
    return "signalled"


# A round of 20 s hands off to a flow of 60 s whose deadline spans its lineage (a rolling
# deploy: the owner of the handoff may lack the second).
short_round = Flow("h-short-round", timeout=20)
long_lineage = Flow("h-long-lineage", timeout=60, timeout_scope="lineage", timeout_grace=5)


@short_round.handler
async def _short_round(ctx: FlowContext, payload: Any) -> Any:
    return Handoff(long_lineage.name, payload=None)


@long_lineage.handler
async def _long_lineage(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("end")


flows = [capped, looper, hopper, hopper_parent, tidy, swallower, mover, waiting_kid, careful,
         short_round, long_lineage]


@waiting_kid.handler
async def _waiting_kid(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("go")


@careful.handler
async def _careful(ctx: FlowContext, payload: Any) -> str:
    """Its cleanup waits for its linked child: the cancel reaches the child at once."""
    kid = await ctx.spawn(waiting_kid, None)
    try:
        if payload == "running":  # meets the cancel at a durable call, not in a wait
            for _ in range(600):
                await ctx.sleep(0.1)
        return str(await kid.result())
    except Cancelled:
        try:
            await kid.result()
        except Exception as ended:  # (ChildCancelled: the child was cancelled)
            effect(ctx.run_id, type(ended).__name__)
        raise
