"""A create reusing a request id its partition applied before, for a run that does not exist,
against a real broker: the owner rejects it (projections.request_reuse), and every reader is
told, where before nothing answered it and every door waited for ever or said "no run"."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from runstream import Client, CreateRejected, Flow, FlowContext, RunNotFound
from runstream.engine.journal import decode
from runstream.engine.journal import events as ev
from runstream.engine.kafka.reader import read_partitions
from runstream.projections.partitioning import run_partition
from tests.conftest import TEST_JOURNAL_PARTITIONS
from tests.integration.support import all_ready, until
from tests.integration.test_cli import cli
from tests.integration.test_lifetime import plain_request, produce_plain, worker

echo = Flow("reuse-echo")


@echo.handler
async def _echo(ctx: FlowContext, payload: int) -> int:
    return await ctx.step("echo", lambda: payload)


def _plain_create(run_id: str, request_id: str) -> bytes:
    return plain_request("run.create-requested", run_id, request_id=request_id,
                         flow=echo.name, payload_json=json.dumps(5))


async def test_a_plain_create_reusing_another_run_s_request_id_is_rejected_at_every_door(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    first = "reuse-first"
    home = run_partition(first, TEST_JOURNAL_PARTITIONS)
    second, third, fourth = [run_id for run_id in (f"reuse-{n}" for n in range(1000))
                             if run_partition(run_id, TEST_JOURNAL_PARTITIONS) == home][:3]
    async with worker(bootstrap, namespace, tmp_path / "w", [echo]) as w, \
            Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        await until(lambda: all_ready(w), "the worker claimed every partition")
        await produce_plain(bootstrap, journal, first, _plain_create(first, "shared"))
        assert await client.get_handle(first).result(timeout=30) == 5
        # Attached before the create is sent: the tail passes the owner's answer.
        waiting = asyncio.ensure_future(client.get_handle(second).result(timeout=30))
        await asyncio.sleep(0.5)
        await produce_plain(bootstrap, journal, second, _plain_create(second, "shared"))
        with pytest.raises(CreateRejected) as live:
            await waiting
        assert live.value.reason == "request-id-reused"
        assert "request id 'shared' was applied before" in str(live.value)
        # The same client sends first's create again with its request id (a signal-with-
        # start retried): its tail passed second's rejection, which names the id too, and
        # answered first's admission with it.
        again = await client.signal_with_start(echo.name, 5, run_id=first, signal="ping",
                                               request_id="shared")
        assert again.run_id == first and await again.result(timeout=30) == 5
        with pytest.raises(RunNotFound, match=r"\(request-id-reused: request id 'shared' "
                           rf".*its records: runstream partition history {home}$"):
            await client.describe(second)
    # A plain reader of the journal finds the answer by the run id it asked for.
    records = [decode(raw.value) async for raw in read_partitions(bootstrap, journal, [home])
               if raw.value is not None]
    [answer] = [r for r in records if isinstance(r, ev.RunCreateRejected)
                and r.envelope.run_id == second]
    assert (answer.reason, answer.envelope.request_id) == ("request-id-reused", "shared")
    assert not [r for r in records if isinstance(r, ev.RunCreateRejected)
                and r.envelope.run_id == first]
    async with Client(bootstrap_servers=bootstrap, namespace=namespace) as later:
        # Attached after it, by a client that never passed it (the read model's history):
        # it waited for ever.
        with pytest.raises(CreateRejected, match="request-id-reused"):
            await later.get_handle(second).result(timeout=30)
        # Sent while no worker runs, no owner answers it (nor will the next: no run, no
        # inbox holds it for a claim's sweep): the readers judge it from its verdict, as
        # the owner would, before it is sent (an attached handle looks again every 5 s)
        # and after.
        waiting = asyncio.ensure_future(later.get_handle(fourth).result(timeout=30))
        await asyncio.sleep(0.5)
        await produce_plain(bootstrap, journal, fourth, _plain_create(fourth, "shared"))
        with pytest.raises(CreateRejected, match="request-id-reused"):
            await waiting
        with pytest.raises(CreateRejected, match="request-id-reused"):
            await later.get_handle(fourth).result(timeout=30)
        with pytest.raises(RunNotFound, match=r"\(request-id-reused: request id 'shared' "):
            await later.describe(fourth)
    shown = await cli("run", "status", second, bootstrap=bootstrap, namespace=namespace,
                      cache=tmp_path / "cache")
    assert shown.code != 0 and shown.err.count("\n") <= 1, shown.err
    assert f"no run '{second}': its create was rejected (request-id-reused:" in shown.err
    # The command it points to names the rejection's run, request and reason.
    shown = await cli("partition", "history", str(home), "--json", bootstrap=bootstrap,
                      namespace=namespace, cache=tmp_path / "cache")
    assert shown.code == 0, shown.err
    [row] = [r for r in json.loads(shown.out) if r["type"] == "run.create-rejected"]
    assert (row["run_id"], row["request_id"], row["reason"]) == (second, "shared",
                                                                "request-id-reused")
    # The id stays free: a create of it with its own request id makes the run.
    async with worker(bootstrap, namespace, tmp_path / "w", [echo]) as w, \
            Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        await until(lambda: all_ready(w), "the worker claimed every partition")
        handle = await client.create_run(echo.name, 7, run_id=second)
        assert await handle.result(timeout=30) == 7
        await produce_plain(bootstrap, journal, third, _plain_create(third, "shared"))
        with pytest.raises(CreateRejected, match="request-id-reused"):
            await client.get_handle(third).result(timeout=30)


class Amount(BaseModel):
    n: int


typed = Flow("reuse-typed", payload=Amount)


@typed.handler
async def _typed(ctx: FlowContext, amount: Amount) -> int:
    return amount.n


async def test_a_rejected_signal_with_start_sent_again_is_answered_as_the_first_send(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    # The first send (by flow name: the client cannot check the payload) is rejected and
    # leaves no run; the same request sent again, fixed, repeats its id. It said "its request
    # id 'K' was used before for another request (to another run, or not a signal)".
    async with worker(bootstrap, namespace, tmp_path / "w", [typed]) as w, \
            Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        await until(lambda: all_ready(w), "the worker claimed every partition")
        for payload in ({"n": "x"}, {"n": 3}):
            with pytest.raises(CreateRejected) as rejected:
                await client.signal_with_start(typed.name, payload, run_id="k1", signal="go",
                                               request_id="K")
            assert rejected.value.reason == "payload-invalid", rejected.value
