"""Signal-with-start on a real broker, through every door (a Client with a Flow and by flow
name, the CLI, a request a plain producer writes from schemas/ alone): no run, it is created
with the signal buffered first; a run that exists gets the signal alone; a settled run
refuses it; one racing a plain create of the same id makes one run that gets the signal."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from runstream import Client, Flow, FlowContext, SignalRefused
from runstream.engine.journal import events as ev
from tests.integration.support import fold, running_worker
from tests.integration.test_cli import cli
from tests.integration.test_lifetime import plain_request, produce_plain

waiter = Flow("sws-waiter")


@waiter.handler
async def _waiter(ctx: FlowContext, payload: Any) -> Any:
    return {"payload": payload, "signal": await ctx.wait_for("go")}


async def test_signal_with_start_through_every_door(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with running_worker(bootstrap, namespace, tmp_path / "w", [waiter]):
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[waiter]) as client, \
                Client(bootstrap_servers=bootstrap, namespace=namespace) as nameless:
            made = await client.signal_with_start(waiter, {"door": "flow"}, run_id="by-flow",
                                                  signal="go", signal_payload=1)
            assert made.request_id is not None  # it created the run
            named = await nameless.signal_with_start("sws-waiter", {"door": "name"},
                                                     run_id="by-name", signal="go",
                                                     signal_payload=2)
            shown = await cli("run", "signal", "by-cli", "go", "--payload", "3", "--start",
                              "sws-waiter", "--start-payload", '{"door": "cli"}', "--json",
                              bootstrap=bootstrap, namespace=namespace,
                              cache=tmp_path / "cache")
            assert shown.code == 0, shown.err
            assert json.loads(shown.out)["created"] is True
            await produce_plain(bootstrap, journal, "by-producer", plain_request(
                "run.signal-with-start-requested", "by-producer", flow="sws-waiter",
                payload_json='{"door": "producer"}', signal_name="go",
                signal_payload_json="4"), record_type="run.signal-with-start-requested")
            for run_id, n in (("by-flow", 1), ("by-name", 2), ("by-cli", 3),
                              ("by-producer", 4)):
                result = await client.get_handle(run_id).result(timeout=60)
                assert result["signal"] == n and result["payload"]["door"] in run_id, result
            assert made.run_id == "by-flow" and named.run_id == "by-name"
            with pytest.raises(SignalRefused, match="the run has ended"):
                await client.signal_with_start(waiter, None, run_id="by-flow", signal="go")
            refused = await cli("run", "signal", "by-cli", "go", "--start", "sws-waiter",
                                bootstrap=bootstrap, namespace=namespace,
                                cache=tmp_path / "cache")
            assert refused.code != 0 and "the run has ended" in refused.err
            await _existing_runs_get_the_signal_alone(client, nameless)


async def _existing_runs_get_the_signal_alone(client: Client, nameless: Client) -> None:
    """A waiting run gets the signal alone (start part ignored, whatever its flow); one
    racing a plain create of the same id: one run, one incarnation, the signal taken."""
    waiting = await client.create_run(waiter, "first", run_id="waiting")
    await waiting.admitted(timeout=30)
    handle = await nameless.signal_with_start("some-other-flow", "ignored", run_id="waiting",
                                              signal="go", signal_payload="later")
    assert handle.request_id is None  # the run existed: the signal alone
    assert await waiting.result(timeout=60) == {"payload": "first", "signal": "later"}
    # The same request sent again (a retry reusing its request id) names the run its first
    # send made, whatever the retry says; its handle said the retry's flow.
    first = await nameless.signal_with_start("sws-waiter", "once", run_id="retried",
                                             signal="go", signal_payload="a",
                                             request_id="retry-1")
    again = await nameless.signal_with_start("some-other-flow", "twice", run_id="retried",
                                             signal="go", signal_payload="b",
                                             request_id="retry-1")
    assert (first.flow, again.flow, again.request_id) == ("sws-waiter", "sws-waiter", "retry-1")
    assert await again.result(timeout=60) == {"payload": "once", "signal": "a"}
    for n in range(5):
        run_id = f"race-{n}"
        created, started = await asyncio.gather(
            client.create_run(waiter, "raced", run_id=run_id),
            client.signal_with_start(waiter, "raced", run_id=run_id, signal="go",
                                     signal_payload=n))
        assert await created.result(timeout=60) == {"payload": "raced", "signal": n}
        assert started.run_id == run_id


async def test_the_journal_shows_one_run_per_race(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """The same race read back from the journal: one life per id (one first activation,
    one incarnation), the signal-with-start applied, never refused."""
    async with running_worker(bootstrap, namespace, tmp_path / "w", [waiter]):
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[waiter]) as client:
            for n in range(5):
                await asyncio.gather(
                    client.signal_with_start(waiter, "raced", run_id=f"r-{n}", signal="go",
                                             signal_payload=n),
                    client.create_run(waiter, "raced", run_id=f"r-{n}"))
            for n in range(5):
                assert (await client.get_handle(f"r-{n}").result(timeout=60))["signal"] == n
    view = await fold(bootstrap, namespace)
    for n in range(5):
        items = view.history[f"r-{n}"]
        # (a first activation: its own record, or inside the run.created, issue 22)
        firsts = [i for i in items if (isinstance(i.record, ev.RunActivated)
                                       and i.record.activation == 1)
                  or (isinstance(i.record, ev.RunCreated) and i.record.activated)]
        assert len(firsts) == 1  # one life: a second run would be activated from 1 again
        lives = {i.record.incarnation for i in items if isinstance(i.record, ev.RunCreated)}
        assert len(lives - {None}) == 1  # (a repeated create's answer names none)
        starts = [i for i in items if isinstance(i.record, ev.RunSignalWithStartRequested)]
        assert [i.verdict.value for i in starts] == ["applied"]


async def test_a_signal_with_start_behind_a_rejected_one_makes_the_run_with_its_signal(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """A plain producer's signal-with-start the owner rejects (its attributes are not JSON)
    and, behind it before any owner answered, a valid one through the Client and one through
    the CLI, each for its run id. The valid ones found the run the first had made, not yet
    admitted: their start part was dropped, and their signal went with the first's
    rejection. The Client's caller was told CreateRejected (attributes it never sent), the
    CLI's too, and the run was never made."""
    for run_id in ("by-client", "by-cli"):
        await produce_plain(bootstrap, journal, run_id, plain_request(
            "run.signal-with-start-requested", run_id, flow=waiter.name,
            payload_json='"plain"', signal_name="go", signal_payload_json='"plain"',
            attributes_json="{bad"), record_type="run.signal-with-start-requested")
    async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                      flows=[waiter]) as client:
        by_client = asyncio.ensure_future(client.signal_with_start(
            waiter, "mine", run_id="by-client", signal="go", signal_payload="client"))
        by_cli = asyncio.ensure_future(cli(
            "run", "signal", "by-cli", "go", "--payload", '"cli"', "--start", waiter.name,
            "--start-payload", '"mine"', bootstrap=bootstrap, namespace=namespace))
        await asyncio.sleep(3)  # (both in the journal before any owner runs)
        assert not by_client.done() and not by_cli.done()
        async with running_worker(bootstrap, namespace, tmp_path / "w", [waiter]):
            handle = await asyncio.wait_for(by_client, 90)
            said = await asyncio.wait_for(by_cli, 90)
            assert said.code == 0, said.err
            # (the run keeps the first request's payload, as a run made behind a refused
            # first create does: decide.run_maker)
            assert await handle.result(timeout=60) == {"payload": "plain", "signal": "client"}
            assert (await client.get_handle("by-cli").result(timeout=60))["signal"] == "cli"
