"""Flows with retry policies, step timeouts and child results with a timeout: used by the
tests in-process (TestEnvironment, an in-process Worker) and by worker processes
(`--app tests.integration.retry_flows:flows`). Each step function counts its attempts per
step (by its idempotency key) in this process, and journals nothing of its own."""

from __future__ import annotations

import asyncio
import collections
import time
from pathlib import Path
from typing import Any

import runstream
from runstream import (
    Flow,
    FlowContext,
    NonRetryable,
    RetryPolicy,
    StepFailed,
    WaitTimeout,
)

picky = Flow("picky")  # which errors a policy retries
slow = Flow("slow")  # attempts that time out, then one that does not
rash = Flow("rash")  # an irreversible step that times out
impatient = Flow("impatient")  # a child's result, with a timeout, then without
patient = Flow("patient")  # a backoff long enough to wait on a durable timer
napper = Flow("napper")  # the child: sleeps, then answers

# Attempts made so far, per step (its idempotency key): bounded by the steps of a test.
attempts: collections.Counter[str] = collections.Counter()
FAST = RetryPolicy(max_attempts=4, initial_interval=0.01, maximum_interval=0.05)


def _attempt() -> int:
    key = runstream.idempotency_key()
    attempts[key] += 1
    return attempts[key]


def flaky(error: str, succeed_at: int) -> str:
    """Fails with `error` until attempt `succeed_at`."""
    attempt = _attempt()
    if attempt >= succeed_at:
        return f"ok at {attempt}"
    if error == "non-retryable":
        raise NonRetryable("the card was declined")
    if error == "wrapped":
        raise RuntimeError("the gateway said no") from NonRetryable("declined")
    raise {"value": ValueError, "key": KeyError, "connection": ConnectionError,
           "cancelled": asyncio.CancelledError}[error](f"{error} error at attempt {attempt}")


@picky.handler
async def _picky(ctx: FlowContext, payload: dict[str, Any]) -> str:
    policy = RetryPolicy(max_attempts=4, initial_interval=0.01,
                         non_retryable=(ValueError,), **payload.get("policy", {}))
    if payload.get("retryable_connection_only"):
        policy = RetryPolicy(max_attempts=4, initial_interval=0.01,
                             retryable=(ConnectionError,))
    try:
        return await ctx.step("flaky", flaky, payload["error"], payload.get("succeed_at", 3),
                              retry=policy)
    except StepFailed as failed:
        return f"failed after {failed.attempts}: {failed.error_type}"


async def _sleepy(seconds_until: int) -> str:
    attempt = _attempt()
    if attempt < seconds_until:
        await asyncio.sleep(30)
    return f"ok at {attempt}"


def _sleepy_sync(seconds_until: int) -> str:
    attempt = _attempt()
    if attempt < seconds_until:
        time.sleep(2)  # (abandoned in its thread when the attempt times out)
    return f"ok at {attempt}"


async def _deaf(seconds_until: int) -> str:
    """Catches the cancel of its time limit and finishes anyway (a client library
    completing its request): its attempt times out all the same."""
    attempt = _attempt()
    if attempt < seconds_until:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(1)
            return f"late at {attempt}"
    return f"ok at {attempt}"


@slow.handler
async def _slow(ctx: FlowContext, payload: dict[str, Any]) -> dict[str, str]:
    first = await ctx.step("async", _sleepy, 3, retry=FAST, timeout=0.3)
    second = await ctx.step("sync", _sleepy_sync, 2, retry=FAST, timeout=0.3)
    deaf = await ctx.step("deaf", _deaf, 2, retry=FAST, timeout=0.3)
    try:
        await ctx.step("never", _sleepy, 99, retry=RetryPolicy(max_attempts=2,
                                                                  initial_interval=0),
                       timeout=0.1)
        third = "finished"
    except StepFailed as failed:
        third = f"{failed.error_type} after {failed.attempts}"
    return {"async": first, "sync": second, "never": third, "deaf": deaf}


@rash.handler
async def _rash(ctx: FlowContext, payload: Any) -> str:
    try:
        charged = await ctx.step("charge", _sleepy, 99, irreversible=True, timeout=0.2,
                                 retry=RetryPolicy(max_attempts=3, initial_interval=0,
                                                   retry_irreversible_on=(ConnectionError,)))
        return str(await ctx.step("receipt", str.upper, charged))
    finally:  # journals nothing while the charge is quarantined: the resolution replays
        await ctx.step("audit", str, "audited")


@napper.handler
async def _napper(ctx: FlowContext, payload: dict[str, Any]) -> str:
    await ctx.sleep(payload["seconds"])
    return "rested"


@impatient.handler
async def _impatient(ctx: FlowContext, payload: dict[str, Any]) -> dict[str, Any]:
    kid = await ctx.spawn(napper, {"seconds": payload["child_sleeps"]})
    try:
        early = await kid.result(timeout=payload["timeout"])
    except WaitTimeout as timed_out:
        early = f"timed out: {timed_out}"
    return {"early": early, "late": await kid.result()}


def fail_once(marker: str) -> str:
    """Fails until the file `marker` exists (it makes it): an attempt counter that outlives
    the worker process."""
    path = Path(marker)
    if not path.exists():
        path.write_text("failed once")
        raise ConnectionError(f"the first attempt fails ({marker})")
    return "ok"


@patient.handler
async def _patient(ctx: FlowContext, payload: dict[str, Any]) -> str:
    policy = RetryPolicy(max_attempts=payload.get("attempts", 3),
                         initial_interval=payload["backoff"], backoff_coefficient=1.0)
    if "marker" in payload:
        return await ctx.step("flaky", fail_once, payload["marker"], retry=policy)
    return await ctx.step("flaky", flaky, "connection", payload.get("succeed_at", 3),
                          retry=policy)


flows = [picky, slow, rash, impatient, napper, patient]
