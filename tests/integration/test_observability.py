"""Metrics and traces against a real broker: a scraped /metrics agrees with the journal
for a known workload, and one trace runs from the client's create through the worker's
activations and steps into a child run."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from runstream import Client, Flow, FlowContext, RunFailed, Worker
from runstream.engine.journal import events as ev
from runstream.projections.state import Verdict
from tests.integration.support import fold

two_steps = Flow("two-steps")
broken = Flow("broken")
waiter = Flow("waiter")
traced = Flow("traced")
leaf = Flow("leaf")


@two_steps.handler
async def _two_steps(ctx: FlowContext, payload: Any) -> int:
    a = await ctx.step("a", lambda: 1)
    return a + await ctx.step("b", lambda: 2)


@broken.handler
async def _broken(ctx: FlowContext, payload: Any) -> None:
    def fail() -> None:
        raise ValueError("broken on purpose")

    await ctx.step("fail", fail)


@waiter.handler
async def _waiter(ctx: FlowContext, payload: Any) -> Any:
    await ctx.sleep(0.2)
    return await ctx.wait_for("go")


@leaf.handler
async def _leaf(ctx: FlowContext, payload: Any) -> str:
    return await ctx.step("leaf-step", lambda: "leaf")


@traced.handler
async def _traced(ctx: FlowContext, payload: Any) -> str:
    await ctx.step("first", lambda: 1)
    await ctx.step("second", lambda: 2)
    kid = await ctx.spawn(leaf, None)
    return str(await kid.result())


FLOWS = [two_steps, broken, waiter, traced, leaf]


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
        text: str = page.read().decode()
    return text


def _value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
           **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_scraped_metrics_match_the_journal(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with Worker(flows=FLOWS, data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
                      namespace=namespace, metrics_port=0) as w, \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS) as c:
        handles = [await c.create_run(two_steps, None, run_id=f"ok-{i}") for i in range(5)]
        bad = await c.create_run(broken, None, run_id="bad")
        slow = await c.create_run(waiter, None, run_id="slow")
        await c.signal("slow", "go", "now")
        assert [await h.result(timeout=60) for h in handles] == [3] * 5
        with pytest.raises(RunFailed):
            await bad.result(timeout=60)
        assert await slow.result(timeout=60) == "now"
        port = w.metrics_port
        assert port
        view = await fold(bootstrap, namespace)
        applied: dict[str, int] = {}
        for items in [*view.history.values(), *view.partition_history.values()]:
            for item in items:
                if item.verdict is Verdict.applied and item.record is not None and (
                        item.record.KIND == "decision"):
                    applied[item.record.TYPE] = applied.get(item.record.TYPE, 0) + 1
        # The client learns results from the journal; the worker may apply its own last
        # records a moment later: scrape until it has applied what the fold saw.
        deadline = time.monotonic() + 30
        while True:
            samples = _samples(await asyncio.to_thread(_scrape, port))
            seen = sum(v for (name, _), v in samples.items()
                       if name == "runstream_decisions_total")
            if seen >= sum(applied.values()) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    for record_type in (ev.RunCreated.TYPE, ev.RunActivated.TYPE, ev.StepCompleted.TYPE,
                        ev.RunCompleted.TYPE, ev.RunFailed.TYPE, ev.TimerFired.TYPE,
                        ev.RunSuspended.TYPE, ev.PartitionEpochClaimed.TYPE):
        assert _value(samples, "runstream_decisions_total", type=record_type) == applied.get(
            record_type, 0), record_type
    assert _value(samples, "runstream_timers_fired_total") == applied[ev.TimerFired.TYPE] == 1
    assert _value(samples, "runstream_signals_delivered_total") == 1
    assert _value(samples, "runstream_step_attempts_total", flow="two-steps", step="a") == 5
    assert _value(samples, "runstream_step_failures_total", flow="broken", step="fail") == 1
    assert _value(samples, "runstream_create_to_settle_seconds_count",
                  flow="two-steps", status="completed") == 5
    assert _value(samples, "runstream_claims_total", outcome="applied") == 4
    assert _value(samples, "runstream_runs", flow="two-steps", status="completed") == 5
    assert _value(samples, "runstream_runs", flow="waiter", status="completed") == 1
    assert _value(samples, "runstream_runs", flow="broken", status="failed") == 1
    assert _value(samples, "runstream_fenced_records_total") == 0
    lags = [v for (name, _), v in samples.items() if name == "runstream_consumer_lag_records"]
    assert lags and all(v >= 0 for v in lags)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()  # the provider stays for the session: keep no more spans here


async def test_one_trace_from_the_client_through_steps_into_a_child(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
    spans: InMemorySpanExporter,
) -> None:
    async with Worker(flows=FLOWS, data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
                      namespace=namespace), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS) as c:
        handle = await c.create_run(traced, None, run_id="traced-1")
        assert await handle.result(timeout=60) == "leaf"
    finished: list[ReadableSpan] = [
        s for s in spans.get_finished_spans()
        if (s.attributes and s.attributes.get("runstream.run_id", "").startswith("traced-1"))
        or s.name.startswith("step")]
    by_id = {s.context.span_id: s for s in finished}
    [create] = [s for s in finished if s.name == "create traced"]
    trace_id = create.context.trace_id
    mine = [s for s in finished if s.context.trace_id == trace_id]
    parents = [s for s in mine if s.name == "run traced"]
    children = [s for s in mine if s.name == "run leaf"]
    assert parents and children, [s.name for s in finished]
    assert all(s.parent is not None and s.parent.span_id == create.context.span_id
               for s in parents)
    steps = {s.name: s for s in mine if s.name.startswith("step ")}
    assert {"step first", "step second", "step leaf-step"} <= set(steps)
    for name in ("step first", "step second"):
        parent = steps[name].parent
        assert parent is not None and by_id[parent.span_id].name == "run traced"
    child_parent = children[0].parent
    assert child_parent is not None and by_id[child_parent.span_id].name == "run traced"
    leaf_parent = steps["step leaf-step"].parent
    assert leaf_parent is not None and by_id[leaf_parent.span_id].name == "run leaf"
