"""The TestEnvironment journals what a worker journals: the same records, in the same order,
for the same flows, since both decide through the same owner code (projections.owner) and
run handlers through the same runner (engine.flow.runner). Runs created through every door
of a worker (a Flow, a flow name, the CLI, a plain producer from schemas/ alone) and of the
environment (a Flow, a flow name) give one sequence of record types per flow. Before, the
environment wrote a run.activated of its own where a worker's first activation rides in its
run.created."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runstream import Client, Flow, FlowContext, RunStatus, Worker
from runstream.engine.journal import events as ev
from runstream.projections.memory import MemoryProjection
from runstream.projections.state import Verdict
from runstream.testing import TestEnvironment
from tests.integration.support import fold, until
from tests.integration.test_lifetime import DOORS, doors, worker

steps: Flow[Any, Any] = Flow("shapes-steps")
waits: Flow[Any, Any] = Flow("shapes-waits")
spawns: Flow[Any, Any] = Flow("shapes-spawns")
capped: Flow[Any, Any] = Flow("shapes-capped", capabilities={"pay"}, max_rounds=2)
FLOWS: list[Flow[Any, Any]] = [steps, waits, spawns, capped]


@steps.handler
async def _steps(ctx: FlowContext, payload: Any) -> int:
    total = 0
    for name in ("a", "b", "c"):
        total += await ctx.step(name, lambda n=name: len(n))
    return total


@waits.handler
async def _waits(ctx: FlowContext, payload: Any) -> str:
    await ctx.step("before", lambda: 1)
    await ctx.sleep(0.2)
    return "slept"


@capped.handler
async def _capped(ctx: FlowContext, payload: Any) -> str:
    return str(await ctx.step("pay", lambda: "paid", requires="pay"))


@spawns.handler
async def _spawns(ctx: FlowContext, payload: Any) -> int:
    child = await ctx.spawn(steps, None, run_id=f"{ctx.run_id}-kid")
    return int(await child.result()) + 1


def asked(history: list[Any]) -> tuple[Any, Any]:
    """What the run's create request asked for: (its ceiling, its round budget)."""
    [create] = [item.record for item in history
                if isinstance(item.record, ev.RunCreateRequested)]
    return create.ceiling, create.max_rounds


def types_of(history: list[Any]) -> list[str]:
    """The record types applied to a run, in journal order."""
    return [item.record.TYPE for item in history
            if item.record is not None and item.verdict is Verdict.applied]


async def in_environment() -> tuple[dict[str, list[str]], dict[str, tuple[Any, Any]]]:
    """flow name -> its run's record types, for runs created by a Flow and by name (equal);
    flow name -> what its create request asked for."""
    shapes: dict[str, list[str]] = {}
    asks: dict[str, tuple[Any, Any]] = {}
    async with TestEnvironment(FLOWS) as env:
        for flow in FLOWS:
            by_flow = await env.start(flow, None, run_id=f"env-{flow.name}")
            by_name = await env.start(flow.name, None, run_id=f"env-name-{flow.name}")
            await env.result(by_flow)
            await env.result(by_name)
            shapes[flow.name] = types_of(env.history(by_flow))
            assert types_of(env.history(by_name)) == shapes[flow.name], flow.name
            asks[flow.name] = asked(env.history(by_flow))
    return shapes, asks


@pytest.mark.parametrize("door", DOORS)
async def test_a_worker_and_the_environment_journal_the_same_records(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path, door: str
) -> None:
    expected, asks = await in_environment()
    assert asks[capped.name] == (["pay"], 2)  # (it asked for neither)
    assert "run.activated" not in expected[steps.name]  # it rides in run.created
    async with worker(bootstrap, namespace, tmp_path / "w", FLOWS), \
            doors(bootstrap, namespace, journal, tmp_path) as (client, create):
        for flow in FLOWS:
            await create(door)(flow, None, f"{door}-{flow.name}")
        for flow in FLOWS:
            await client.get_handle(f"{door}-{flow.name}").result(timeout=60)
        kid = f"{door}-{spawns.name}-kid"

        async def folded() -> MemoryProjection | None:
            # (the kid's wake of its parent is applied before the parent settles)
            view = await fold(bootstrap, namespace)
            return view if types_of(view.history.get(kid, [])) else None
        projection: MemoryProjection = await until(folded, "the journal to hold every run")
    for flow in FLOWS:
        made = types_of(projection.history[f"{door}-{flow.name}"])
        assert made == expected[flow.name], (flow.name, made, expected[flow.name])
        if door == "flow":  # (the other doors know no flow: they ask for no limits)
            assert asked(projection.history[f"{door}-{flow.name}"]) == asks[flow.name]


signalled: Flow[Any, Any] = Flow("shapes-signalled")


@signalled.handler
async def _signalled(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("go")


WHERE = "flow = 'shapes-signalled'"


async def test_a_batch_journals_the_same_records_in_a_worker_and_the_environment(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """A batch's run (runstream.batch) too: its last step rides in its run.completed in
    both. A worker's closed its read model inside the handler, which let the step go out
    alone first."""
    async with TestEnvironment([signalled]) as env:
        for n in range(2):
            await env.start(signalled, None, run_id=f"env-s{n}")
        await env.run_until_idle()
        batch = await env.signal_where(WHERE, "go", 1)
        assert (await batch.result())["done"] == 2
        expected = types_of(env.history(batch.run_id))
    assert expected[-2:] == ["step.completed", "run.completed"], expected
    async with worker(bootstrap, namespace, tmp_path / "w", [signalled]), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=[signalled],
                   read_model_dir=tmp_path / "rm") as client:
        for n in range(2):
            await client.create_run(signalled, None, run_id=f"s{n}")
        for n in range(2):
            await until(lambda n=n: _suspended(client, f"s{n}"),  # type: ignore[misc]
                        f"s{n} to wait")
        handle = await client.signal_where(WHERE, "go", 1)
        assert (await handle.result(timeout=60))["done"] == 2
    projection = await fold(bootstrap, namespace)
    made = types_of(projection.history[handle.run_id])
    assert made == expected, (made, expected)


async def _suspended(client: Client, run_id: str) -> bool:
    return (await client.describe(run_id)).status is RunStatus.suspended


async def test_a_parked_handler_holds_no_slot_in_a_worker_as_in_the_environment(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """With one slot, a run waiting for a signal (its handler parked in the worker's sticky
    cache, holding no slot), then a new run: the worker counted the parked handler and gave
    the new run a run.activated of its own; the environment activated it in its
    run.created."""
    async with TestEnvironment([signalled, steps], concurrency=1) as env:
        await env.start(signalled, None, run_id="w")
        await env.run_until_idle()
        await env.start(steps, None, run_id="q")
        await env.result("q")
        expected = types_of(env.history("q"))
    assert "run.activated" not in expected, expected
    w = Worker(flows=[signalled, steps], data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
               namespace=namespace, session_timeout_ms=6000, concurrency=1)
    await w.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[signalled, steps], read_model_dir=tmp_path / "rm") as client:
            await client.create_run(signalled, None, run_id="w")
            await until(lambda: _suspended(client, "w"), "w to wait")
            await until(lambda: len(w.sticky) == 1, "w's handler to park")
            await client.create_run(steps, None, run_id="q")
            await client.get_handle("q").result(timeout=60)
    finally:
        await w.stop()
    projection = await fold(bootstrap, namespace)
    made = types_of(projection.history["q"])
    assert made == expected, (made, expected)
