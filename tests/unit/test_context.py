"""FlowContext: durable steps, journaled values, replay, retries, quarantine. No broker.

The port below is an honest in-memory JournalPort: every decision the context makes becomes
a real record (with envelope, source and sequence) folded through the real reducer, so a
second context built from the folded journal replays exactly what the first one journaled.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic import BaseModel

from runstream.engine.errors import NonDeterminism, StepFailed
from runstream.engine.flow.context import (
    FlowContext,
    Quarantined,
    RunReleased,
    Suspend,
    args_digest,
)
from runstream.engine.flow.definition import RetryPolicy
from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.projections.memory import MemoryProjection
from runstream.projections.state import JournalEntry, RunState, RunStatus, Verdict, Wait
from tests.builders import Writer, create, created

RUN = "r1"


class MemoryPort:
    """A JournalPort that folds each decision for run r1 through the real reducer."""

    def __init__(self) -> None:
        self.writer = Writer("w1")
        self.projection = MemoryProjection(keep_history=True)
        self.emitted: list[JournalRecord] = []
        self.active = True
        self.unacked = 0  # records sent since the last barrier
        self.barriers: list[int] = []  # how many records each barrier covered
        self.clock_ms = 1_000_000
        self.steps_timed: list[tuple[str, bool]] = []
        self.not_called: set[tuple[int, int]] = set()  # (position, attempt) never called
        # Calls kept through a release, by (position, attempt), and whether a cancel keeps one.
        self.kept: dict[tuple[int, int], asyncio.Future[Any]] = {}
        self.carrying = False
        self.durable_backoff_after_ms = 2_000
        self.timed_out = False  # (the run's deadline never passes here)
        self._offset = 0
        self._fold(self.writer.claim(0))
        self._fold(create(RUN, "q1"))
        self._fold(created(self.writer, RUN, "q1", request_offset=1))
        self._fold(self.writer.decide(ev.RunActivated, run_id=RUN, mode="new", activation=1))
        assert self.projection.runs[RUN].status is RunStatus.running

    def _fold(self, record: JournalRecord) -> None:
        verdict = self.projection.apply_record(0, self._offset, record)
        assert verdict is Verdict.applied, (record, verdict)
        self._offset += 1

    def hold_step(self, body: dict[str, Any], irreversible: bool) -> None:
        self.send(ev.StepCompleted, kind="step", **body)  # (this port holds nothing back)

    def send(self, cls: type[JournalRecord], **body: Any) -> None:
        record = self.writer.decide(cls, run_id=RUN, **body)
        self._fold(record)
        self.emitted.append(record)
        self.unacked += 1

    async def barrier(self) -> None:
        self.barriers.append(self.unacked)
        self.unacked = 0

    async def send_confirmed(self, cls: type[JournalRecord], **body: Any) -> None:
        self.send(cls, **body)  # _fold asserts the reducer applied it
        await self.barrier()

    def ensure_active(self) -> None:
        if not self.active:
            raise RunReleased("partition 0 is no longer executed here")

    def now_ms(self) -> int:
        return self.clock_ms

    def on_step(self, name: str, seconds: float, ok: bool) -> None:
        self.steps_timed.append((name, ok))

    def never_called(self, position: int, attempt: int) -> bool:
        return (position, attempt) in self.not_called

    def carried_call(self, position: int, attempt: int) -> asyncio.Future[Any] | None:
        return self.kept.pop((position, attempt), None)

    def carry(self, position: int, attempt: int, call: asyncio.Future[Any]) -> bool:
        if self.carrying:
            self.kept[(position, attempt)] = call
        return self.carrying

    def run_state(self) -> RunState:
        return self.projection.runs[RUN]

    def entry(self, position: int) -> JournalEntry | None:
        return self.projection.store.entry(RUN, position)

    async def suspend(self, wait: Wait) -> JournalEntry | None:
        raise Suspend(wait)

    async def quarantine(self, quarantine: Quarantined) -> Quarantined:
        return quarantine  # (journals nothing: the tests look at the exception)

    @property
    def journal(self) -> tuple[JournalEntry, ...]:
        return self.projection.journal(RUN)

    def context(self) -> FlowContext:
        """A new activation: a context over the journal as folded so far."""
        return FlowContext(run=self.run_state(), journal=self.journal, port=self)

    def types(self) -> list[str]:
        return [type(record).__name__ for record in self.emitted]


class Receipt(BaseModel):
    order_id: str
    amount: int
    tags: list[str] = []


class Calls:
    def __init__(self) -> None:
        self.names: list[str] = []

    def count(self, name: str) -> int:
        return self.names.count(name)


async def checkout(ctx: FlowContext, calls: Calls) -> dict[str, Any]:
    """A handler mixing result types, sync and async functions, args and kwargs."""

    async def reserve(order_id: str, *, amount: int) -> Receipt:
        calls.names.append("reserve")
        return Receipt(order_id=order_id, amount=amount, tags=["a", "b"])

    def totals(receipt: Receipt) -> dict[str, int]:
        calls.names.append("totals")
        return {"amount": receipt.amount, "fee": 2}

    async def lines() -> list[int]:
        calls.names.append("lines")
        return [3, 1, 2]

    def note() -> str:
        calls.names.append("note")
        return "ok"

    def nothing() -> None:
        calls.names.append("nothing")

    receipt = await ctx.step("reserve", reserve, "o-7", amount=5)
    total = await ctx.step("totals", totals, receipt)
    items = await ctx.step("lines", lines)
    text = await ctx.step("note", note)
    empty = await ctx.step("nothing", nothing)
    return {"receipt": receipt, "totals": total, "lines": items, "note": text, "none": empty}


STEP_NAMES = ["reserve", "totals", "lines", "note", "nothing"]


async def test_first_execution_runs_each_step_once_and_journals_results() -> None:
    port, calls = MemoryPort(), Calls()
    out = await checkout(port.context(), calls)
    assert calls.names == STEP_NAMES
    assert out["receipt"] == Receipt(order_id="o-7", amount=5, tags=["a", "b"])
    assert out["totals"] == {"amount": 5, "fee": 2}
    assert out["lines"] == [3, 1, 2] and out["note"] == "ok" and out["none"] is None
    assert port.types() == ["StepCompleted"] * 5
    assert [(e.position, e.name, e.kind, e.status, e.attempts) for e in port.journal] == [
        (i, name, "step", "completed", 1) for i, name in enumerate(STEP_NAMES)]
    results = [e.result_json for e in port.journal]
    assert results == ['{"amount":5,"order_id":"o-7","tags":["a","b"]}',
                       '{"amount":5,"fee":2}', "[3,1,2]", '"ok"', "null"]


async def test_replay_returns_identical_typed_values_without_calling_steps() -> None:
    port, first_calls = MemoryPort(), Calls()
    first = await checkout(port.context(), first_calls)
    emitted = len(port.emitted)

    replay_calls = Calls()
    again = await checkout(port.context(), replay_calls)
    assert replay_calls.names == []
    assert len(port.emitted) == emitted  # a replay journals nothing
    assert again == first
    assert type(again["receipt"]) is Receipt  # typed by the step's return annotation
    assert type(again["totals"]) is dict and type(again["lines"]) is list


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")
async def test_first_run_returns_what_a_replay_returns() -> None:
    port = MemoryPort()

    def pair():  # type: ignore[no-untyped-def]  (no annotation: any JSON value)
        return ("x", 1)

    def model_as_dict() -> Receipt:
        return {"order_id": "o-1", "amount": "3"}  # type: ignore[return-value]

    ctx = port.context()
    first = [await ctx.step("pair", pair), await ctx.step("model", model_as_dict)]
    replayed = port.context()
    again = [await replayed.step("pair", pair), await replayed.step("model", model_as_dict)]
    assert first == again == [["x", 1], Receipt(order_id="o-1", amount=3)]
    assert type(first[1]) is Receipt


class Invoice(BaseModel):
    invoice_id: str
    total: float


def _logged(fn: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
    @functools.wraps(fn)
    async def wrapper() -> Any:
        return await fn()

    return wrapper


@_logged
async def _get_receipt() -> Receipt:
    return Receipt(order_id="o-1", amount=3)


@_logged
async def _get_invoice() -> Invoice:
    return Invoice(invoice_id="i-1", total=99.5)


async def test_steps_behind_one_decorator_keep_their_own_result_types() -> None:
    # The wrappers share one code object: the type of whichever the process met first was
    # every one's (an Invoice came back a Receipt, its total lost from the journal).
    port = MemoryPort()
    ctx = port.context()
    first = [await ctx.step("receipt", _get_receipt), await ctx.step("invoice", _get_invoice)]
    replayed = port.context()
    again = [await replayed.step("receipt", _get_receipt),
             await replayed.step("invoice", _get_invoice)]
    assert first == again == [Receipt(order_id="o-1", amount=3),
                              Invoice(invoice_id="i-1", total=99.5)]
    assert port.journal[1].result_json == '{"invoice_id":"i-1","total":99.5}'


async def test_replay_resumes_after_the_last_journaled_position() -> None:
    port, calls = MemoryPort(), Calls()

    def record(name: str, value: int) -> int:
        calls.names.append(name)
        return value

    async def handler(ctx: FlowContext, stop_after: int | None) -> list[int]:
        out = []
        for i in range(3):
            if stop_after is not None and i == stop_after:
                port.active = False
            out.append(await ctx.step(f"s{i}", record, f"s{i}", i))
        return out

    with pytest.raises(RunReleased):
        await handler(port.context(), stop_after=2)
    assert calls.names == ["s0", "s1"] and len(port.journal) == 2

    port.active = True
    assert await handler(port.context(), stop_after=None) == [0, 1, 2]
    assert calls.names == ["s0", "s1", "s2"]
    assert [e.name for e in port.journal] == ["s0", "s1", "s2"]


async def test_now_is_journaled_and_identical_on_replay() -> None:
    port = MemoryPort()
    port.clock_ms = 1_700_000_123_456
    first = await port.context().now()
    assert first == datetime(2023, 11, 14, 22, 15, 23, 456000, tzinfo=UTC)
    entry = port.journal[0]
    assert (entry.name, entry.kind, entry.status, entry.result_json) == (
        "now", "now", "completed", "1700000123456")

    port.clock_ms = 1_800_000_000_000
    emitted = len(port.emitted)
    assert await port.context().now() == first
    assert len(port.emitted) == emitted


async def test_now_uses_the_ports_clock_in_utc() -> None:
    port = MemoryPort()
    port.clock_ms = int(datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC).timestamp() * 1000)
    value = await port.context().now()
    assert value == datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC) and value.tzinfo is UTC


async def test_uuid_is_journaled_and_identical_on_replay() -> None:
    port = MemoryPort()
    ctx = port.context()
    first = [await ctx.uuid(), await ctx.uuid()]
    assert all(isinstance(value, uuid.UUID) for value in first) and first[0] != first[1]
    assert [(e.kind, e.result_json) for e in port.journal] == [
        ("uuid", f'"{value}"') for value in first]

    emitted = len(port.emitted)
    replay = port.context()
    assert [await replay.uuid(), await replay.uuid()] == first
    assert len(port.emitted) == emitted
    assert await MemoryPort().context().uuid() not in first  # a fresh run draws anew


async def test_mixed_durable_calls_replay_in_order() -> None:
    port = MemoryPort()
    port.clock_ms = 1_700_000_000_000

    async def handler(ctx: FlowContext) -> tuple[Any, ...]:
        a = await ctx.step("a", lambda: 1)
        when = await ctx.now()
        ident = await ctx.uuid()
        b = await ctx.step("b", lambda: str(ident))
        return a, when, ident, b

    first = await handler(port.context())
    assert [(e.position, e.kind) for e in port.journal] == [
        (0, "step"), (1, "now"), (2, "uuid"), (3, "step")]
    port.clock_ms = 1_900_000_000_000
    assert await handler(port.context()) == first


async def test_other_step_name_at_a_journaled_position_is_nondeterminism() -> None:
    port = MemoryPort()
    await port.context().step("reserve", lambda: 1)
    calls: list[str] = []
    ctx = port.context()
    try:
        await ctx.step("charge", lambda: calls.append("charge"))
    except Exception as exc:  # a handler that swallows everything
        caught: Exception | None = exc
    else:
        caught = None
    assert isinstance(caught, NonDeterminism)
    assert ctx.nondeterminism is caught
    message = str(caught)
    assert "'charge'" in message and "'reserve'" in message and "position 0" in message
    assert calls == [] and len(port.emitted) == 1


def journal_now(ctx: FlowContext) -> Awaitable[Any]:
    return ctx.now()


def journal_uuid(ctx: FlowContext) -> Awaitable[Any]:
    return ctx.uuid()


def step_named_now(ctx: FlowContext) -> Awaitable[Any]:
    return ctx.step("now", lambda: 0)


def step_named_uuid(ctx: FlowContext) -> Awaitable[Any]:
    return ctx.step("uuid", lambda: 0)


@pytest.mark.parametrize("first, replay", [
    (journal_now, step_named_now),  # same name, kind now vs step
    (step_named_uuid, journal_uuid),  # same name, kind step vs uuid
    (journal_uuid, journal_now),
])
async def test_other_kind_at_a_journaled_position_is_nondeterminism(
    first: Callable[[FlowContext], Awaitable[Any]],
    replay: Callable[[FlowContext], Awaitable[Any]],
) -> None:
    port = MemoryPort()
    await first(port.context())
    emitted = len(port.emitted)
    ctx = port.context()
    with pytest.raises(NonDeterminism) as raised:
        await replay(ctx)
    assert ctx.nondeterminism is raised.value
    assert len(port.emitted) == emitted


async def test_no_nondeterminism_when_the_replay_matches() -> None:
    port = MemoryPort()
    await port.context().step("a", lambda: 1)
    ctx = port.context()
    assert await ctx.step("a", lambda: 2) == 1
    assert ctx.nondeterminism is None


def flaky(failures: int, calls: list[int]) -> Any:
    async def charge(amount: int) -> str:
        calls.append(amount)
        if len(calls) <= failures:
            raise ConnectionError(f"gateway down #{len(calls)}")
        return f"ch-{amount}"

    return charge


async def test_retry_journals_failures_then_completion() -> None:
    port, calls = MemoryPort(), []
    value = await port.context().step("charge", flaky(2, calls), 5,
                                      retry=RetryPolicy(max_attempts=3, initial_interval=0))
    assert value == "ch-5" and calls == [5, 5, 5]
    assert port.types() == ["StepFailed", "StepFailed", "StepCompleted"]
    failed = port.emitted[:2]
    assert [(r.attempt, r.will_retry, r.error_type, r.error_message) for r in failed] == [
        (1, True, "ConnectionError", "gateway down #1"),
        (2, True, "ConnectionError", "gateway down #2")]
    assert all(r.position == 0 and r.name == "charge" for r in failed)
    completed = port.emitted[2]
    assert isinstance(completed, ev.StepCompleted)
    assert (completed.attempt, completed.result_json) == (3, '"ch-5"')
    entry = port.journal[0]
    assert (entry.status, entry.attempts, entry.result_json) == ("completed", 3, '"ch-5"')

    assert await port.context().step("charge", flaky(0, calls), 5) == "ch-5"
    assert len(calls) == 3


async def test_retry_waits_the_policy_delay_and_journals_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []

    async def fake_sleep(delay: float) -> None:
        slept.append(delay)

    monkeypatch.setattr("runstream.engine.flow.context.asyncio.sleep", fake_sleep)
    port, calls = MemoryPort(), []
    policy = RetryPolicy(max_attempts=4, initial_interval=0.5, backoff_coefficient=2.0,
                         maximum_interval=1.5)
    await port.context().step("charge", flaky(3, calls), 1, retry=policy)
    assert slept == [0.5, 1.0, 1.5]
    assert [r.retry_delay_ms for r in port.emitted if isinstance(r, ev.StepFailed)] == [
        500, 1000, 1500]


async def test_a_durable_backoff_journaled_but_not_yet_waited_is_waited_on_replay() -> None:
    """The failure journals when the next attempt is due; a worker that dies before its
    run.suspended leaves a run that replays to the retrying step: it suspends for what is
    left of the backoff, and runs the attempt only once the due time has passed."""
    port, calls = MemoryPort(), []
    policy = RetryPolicy(max_attempts=3, initial_interval=600)
    with pytest.raises(Suspend) as first:
        await port.context().step("charge", flaky(1, calls), 5, retry=policy)
    [failed] = [r for r in port.emitted if isinstance(r, ev.StepFailed)]
    assert failed.retry_at_ms == port.clock_ms + 600_000 and failed.will_retry
    assert (first.value.wait.kind, first.value.wait.due_ms) == ("retry", failed.retry_at_ms)
    # (MemoryPort journals no run.suspended: the crash between the two records)
    port.clock_ms += 1_000
    with pytest.raises(Suspend) as replayed:
        await port.context().step("charge", flaky(1, calls), 5, retry=policy)
    assert replayed.value.wait.due_ms == failed.retry_at_ms and calls == [5]
    port.clock_ms = failed.retry_at_ms
    assert await port.context().step("charge", flaky(1, calls), 5, retry=policy) == "ch-5"
    assert calls == [5, 5]


async def test_without_a_policy_a_step_is_attempted_once() -> None:
    port, calls = MemoryPort(), []
    with pytest.raises(StepFailed) as raised:
        await port.context().step("charge", flaky(1, calls), 1)
    assert calls == [1] and raised.value.attempts == 1
    record = port.emitted[0]
    assert isinstance(record, ev.StepFailed)
    assert (record.will_retry, record.retry_delay_ms) == (False, 0)


async def test_exhausted_retries_raise_step_failed_and_replay_reraises() -> None:
    port, calls = MemoryPort(), []
    with pytest.raises(StepFailed) as raised:
        await port.context().step("charge", flaky(5, calls), 9,
                                  retry=RetryPolicy(max_attempts=3, initial_interval=0))
    error = raised.value
    assert (error.step, error.error_type, error.message, error.attempts) == (
        "charge", "ConnectionError", "gateway down #3", 3)
    assert isinstance(error.__cause__, ConnectionError)
    assert "after 3 attempt(s)" in str(error)
    assert [(r.attempt, r.will_retry) for r in port.emitted] == [
        (1, True), (2, True), (3, False)]
    entry = port.journal[0]
    assert (entry.status, entry.attempts, entry.error_type, entry.error_message) == (
        "failed", 3, "ConnectionError", "gateway down #3")

    emitted = len(port.emitted)
    with pytest.raises(StepFailed) as replayed:
        await port.context().step("charge", flaky(0, calls), 9,
                                  retry=RetryPolicy(max_attempts=3, initial_interval=0))
    assert str(replayed.value) == str(error)
    assert replayed.value.attempts == 3
    assert len(calls) == 3 and len(port.emitted) == emitted


async def test_replay_of_a_retrying_step_resumes_at_the_next_attempt() -> None:
    port, calls = MemoryPort(), []
    policy = RetryPolicy(max_attempts=3, initial_interval=0)

    async def charge_and_lose_run() -> str:
        calls.append(1)
        port.active = False  # the worker is released while the attempt fails
        raise ConnectionError("gateway down")

    with pytest.raises(RunReleased):
        await port.context().step("charge", charge_and_lose_run, retry=policy)
    assert calls == [1]  # released before attempt 2 began
    entry = port.journal[0]
    assert (entry.status, entry.attempts) == ("retrying", 1)

    port.active = True
    emitted = len(port.emitted)
    assert await port.context().step("charge", flaky(0, calls), 7, retry=policy) == "ch-7"
    resumed = port.emitted[emitted:]
    assert [type(r).__name__ for r in resumed] == ["StepCompleted"]
    assert resumed[0].attempt == 2
    assert port.journal[0].attempts == 2


async def test_resumed_retries_count_the_attempts_already_made() -> None:
    port, calls = MemoryPort(), []
    policy = RetryPolicy(max_attempts=3, initial_interval=0)
    port.send(ev.StepFailed, position=0, name="charge", attempt=2, error_type="E",
              error_message="x", will_retry=True)
    with pytest.raises(StepFailed) as raised:
        await port.context().step("charge", flaky(9, calls), 1, retry=policy)
    assert len(calls) == 1 and raised.value.attempts == 3


async def test_irreversible_step_journals_started_before_running() -> None:
    port = MemoryPort()
    seen: list[list[str]] = []

    def send_money() -> int:
        seen.append(port.types())
        entry = port.journal[0]
        assert (entry.status, entry.irreversible, entry.attempts) == ("started", True, 0)
        return 42

    assert await port.context().step("pay", send_money, irreversible=True) == 42
    assert seen == [["StepStarted"]]
    started = port.emitted[0]
    assert isinstance(started, ev.StepStarted)
    assert (started.position, started.name, started.attempt, started.irreversible) == (
        0, "pay", 1, True)
    assert port.types() == ["StepStarted", "StepCompleted"]
    entry = port.journal[0]
    assert (entry.status, entry.irreversible, entry.result_json) == ("completed", True, "42")

    # A completed irreversible step replays like any other.
    assert await port.context().step("pay", lambda: 0, irreversible=True) == 42


async def test_reversible_step_journals_no_started_record() -> None:
    port = MemoryPort()
    await port.context().step("read", lambda: 1)
    assert port.types() == ["StepCompleted"]


async def test_irreversible_step_started_without_outcome_is_quarantined_on_replay() -> None:
    port = MemoryPort()

    def crash() -> None:
        raise RunReleased("the worker died while paying")

    with pytest.raises(RunReleased):
        await port.context().step("pay", crash, irreversible=True)
    assert port.types() == ["StepStarted"]

    calls: list[str] = []
    emitted = len(port.emitted)
    ctx = port.context()
    try:
        await ctx.step("pay", lambda: calls.append("pay"), irreversible=True)
    except Exception:  # Quarantined must not be swallowed by a handler's except Exception
        pytest.fail("Quarantined was caught as an Exception")
    except Quarantined as quarantine:
        entry = quarantine.entry
        assert (entry.name, entry.position, entry.status) == ("pay", 0, "started")
        assert "'pay'" in str(quarantine) and "position 0" in str(quarantine)
        assert "attempt 1" in str(quarantine)
    else:
        pytest.fail("no Quarantined")
    assert calls == [] and len(port.emitted) == emitted


async def test_a_started_step_its_worker_knows_never_ran_is_retried_not_quarantined() -> None:
    """The worker that sent attempt 1's step.started and never called the function (its
    source failed before the record was confirmed) says so on replay: that attempt is
    journaled NotCalled and the step runs as attempt 2."""
    port = MemoryPort()

    def crash() -> None:
        raise RunReleased("the source failed while confirming")

    with pytest.raises(RunReleased):
        await port.context().step("pay", crash, irreversible=True)
    port.not_called.add((0, 1))
    calls: list[str] = []
    assert await port.context().step("pay", lambda: calls.append("pay") or "paid",
                                     irreversible=True) == "paid"
    assert calls == ["pay"]
    assert port.types() == ["StepStarted", "StepFailed", "StepStarted", "StepCompleted"]
    not_called = port.emitted[1]
    assert isinstance(not_called, ev.StepFailed)
    assert (not_called.error_type, not_called.attempt, not_called.will_retry) == (
        "NotCalled", 1, True)
    started = port.emitted[2]
    assert isinstance(started, ev.StepStarted) and started.attempt == 2


async def test_quarantine_names_the_attempt_that_was_in_flight() -> None:
    port, calls = MemoryPort(), []

    async def pay() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("refused")
        raise RunReleased("crashed during attempt 2")

    with pytest.raises(RunReleased):
        await port.context().step("pay", pay, irreversible=True,
                                  retry=RetryPolicy(max_attempts=3, initial_interval=0,
                                                    retry_irreversible_on=(ConnectionError,)))
    assert port.types() == ["StepStarted", "StepFailed", "StepStarted"]
    with pytest.raises(Quarantined, match="attempt 2"):
        await port.context().step("pay", pay, irreversible=True)
    assert len(calls) == 2


@pytest.mark.parametrize("irreversible", [False, True])
async def test_released_run_stops_before_the_step_function(irreversible: bool) -> None:
    port = MemoryPort()
    port.active = False
    calls: list[str] = []
    with pytest.raises(RunReleased):
        await port.context().step("pay", lambda: calls.append("pay"), irreversible=irreversible)
    assert calls == [] and port.emitted == [] and port.journal == ()


async def test_released_run_journals_no_value() -> None:
    port = MemoryPort()
    port.active = False
    with pytest.raises(RunReleased):
        await port.context().now()
    with pytest.raises(RunReleased):
        await port.context().uuid()
    assert port.emitted == []


async def test_replayed_positions_need_no_active_run() -> None:
    port = MemoryPort()
    ctx = port.context()
    await ctx.step("a", lambda: 1)
    await ctx.uuid()
    port.active = False
    replay = port.context()
    assert await replay.step("a", lambda: 2) == 1
    await replay.uuid()
    with pytest.raises(RunReleased):
        await replay.step("b", lambda: 3)


def test_release_and_quarantine_escape_except_exception() -> None:
    assert issubclass(RunReleased, BaseException) and not issubclass(RunReleased, Exception)
    assert issubclass(Quarantined, BaseException) and not issubclass(Quarantined, Exception)


async def test_irreversible_step_that_raises_is_quarantined_not_retried() -> None:
    """A charge that times out after it went through must not run again (defect 2)."""
    port, calls = MemoryPort(), []

    async def charge() -> None:
        calls.append(1)
        raise TimeoutError("the gateway did not answer")

    with pytest.raises(Quarantined) as raised:
        await port.context().step("charge", charge, irreversible=True,
                                  retry=RetryPolicy(max_attempts=5, initial_interval=0))
    assert calls == [1]
    assert port.types() == ["StepStarted"]  # no StepFailed: the outcome is unknown
    assert isinstance(raised.value.cause, TimeoutError)
    assert "TimeoutError" in str(raised.value) and "'charge'" in str(raised.value)
    # The next activation finds the step started without outcome: quarantined again.
    with pytest.raises(Quarantined):
        await port.context().step("charge", charge, irreversible=True)
    assert calls == [1]


async def test_irreversible_step_retries_only_exceptions_declared_as_no_effect() -> None:
    port, calls = MemoryPort(), []

    async def charge() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError("nothing listens")
        return "ch-1"

    policy = RetryPolicy(max_attempts=3, initial_interval=0,
                         retry_irreversible_on=(ConnectionRefusedError,))
    assert await port.context().step("charge", charge, irreversible=True, retry=policy) == "ch-1"
    assert port.types() == ["StepStarted", "StepFailed"] * 2 + ["StepStarted", "StepCompleted"]


async def test_a_step_waits_for_the_previous_outcome_and_nothing_else() -> None:
    """One acknowledgement per step: step n+1 starts only after step n's outcome is acked,
    and the last step's outcome is not awaited by the context (it rides with completion)."""
    port = MemoryPort()
    ctx = port.context()
    for name in ("a", "b", "c"):
        await ctx.step(name, lambda: 1)
    assert port.barriers == [0, 1, 1]  # before a: nothing; before b: a; before c: b
    assert port.unacked == 1  # c's completion goes out with the run's completion


async def test_step_outcomes_journal_the_digest_of_their_arguments() -> None:
    """Failed attempts and the completion carry the digest of the arguments as passed, even
    when the function mutates them; the projected entry keeps it for a dry run."""
    port = MemoryPort()
    attempts: list[int] = []

    def grow(items: list[int], *, label: str) -> int:
        attempts.append(1)
        items.append(len(items))
        if len(attempts) < 2:
            raise ConnectionError("once")
        return len(items)

    items = [1, 2]
    digest = args_digest(([1, 2],), {"label": "x"})
    await port.context().step("grow", grow, items, label="x",
                              retry=RetryPolicy(max_attempts=2, initial_interval=0))
    failed, completed = port.emitted
    assert isinstance(failed, ev.StepFailed) and isinstance(completed, ev.StepCompleted)
    assert failed.args_digest == completed.args_digest == digest
    assert port.journal[0].args_digest == digest
    assert digest != args_digest(([1, 2],), {"label": "y"})
    assert len(digest) == 16 and int(digest, 16) >= 0


async def test_the_observer_sees_every_position_with_a_steps_arguments() -> None:
    port = MemoryPort()
    await port.context().step("a", lambda x: x, 1)
    seen: list[tuple[int, str, str, Any]] = []
    ctx = port.context()
    ctx.observer = lambda position, kind, name, arguments: seen.append(
        (position, kind, name, arguments))
    assert await ctx.step("a", lambda x: x, 1) == 1  # replayed: observed all the same
    await ctx.uuid()
    assert ctx.patched("v2") is True
    assert seen == [(0, "step", "a", ((1,), {})), (1, "uuid", "uuid", None),
                    (2, "patch", "v2", None)]
    replay = port.context()
    replay.observer = lambda position, kind, name, arguments: seen.append(
        (position, kind, name, arguments))
    seen.clear()
    await replay.step("a", lambda x: x, 1)
    await replay.uuid()
    replay.deprecate_patch("v2")
    assert [(p, k) for p, k, _, _ in seen] == [(0, "step"), (1, "uuid"), (2, "patch")]
