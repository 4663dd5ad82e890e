"""Batch operations on a real broker (issue 21 item 4): `runs cancel|signal|resume --where`
and Client.cancel_where/signal_where/resume_where run as the built-in flow `runstream.batch`
on a worker: 2,000 runs cancelled by query with progress; a re-run of the same batch id
attaches and changes nothing; a dry run only counts; refusals come with their reasons; a
run created after the batch began is not matched."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from runstream import Client, Flow, FlowContext, Handoff, RunStatus
from runstream.engine.cli import batch_operations
from runstream.engine.flow.batch_run import ANSWER_WAIT_S, _send
from runstream.engine.journal import events as ev
from runstream.engine.worker.batch import WorkerBatchIO
from runstream.projections.batch import BatchSpec, batch_run_id
from tests.integration.support import fold, running_worker, status_when, until
from tests.integration.test_cli import cli, one_line_error
from tests.integration.test_lifetime import plain_request, produce_plain

parked: Flow[Any, Any] = Flow("batch-parked")


@parked.handler
async def _parked(ctx: FlowContext, payload: Any) -> Any:
    return await ctx.wait_for("go")


handing: Flow[Any, Any] = Flow("batch-handing")


@handing.handler
async def _handing(ctx: FlowContext, payload: Any) -> Any:
    if payload == 0:
        return Handoff(payload=1)
    return await ctx.wait_for("go")


relaying: Flow[Any, Any] = Flow("batch-relaying")


@relaying.handler
async def _relaying(ctx: FlowContext, payload: int) -> Any:
    if payload < 11:  # rounds 1..10 hand off too: "x~10" sorts before "x~2".."x~9"
        return Handoff(payload=payload + 1)
    return await ctx.wait_for("go")


stepping: Flow[Any, Any] = Flow("batch-stepping")


async def _nap(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "napped"


@stepping.handler
async def _stepping(ctx: FlowContext, payload: Any) -> Any:
    """A step of `payload` seconds (3 when None): a cancel waits for its end, the run's
    next durable call (tests/unit/test_batches_env.py too)."""
    await ctx.step("long", _nap, payload or 3)
    return "done"


flows: list[Flow[Any, Any]] = [parked, handing, relaying, stepping]


async def _create(client: Client, count: int, prefix: str, **attributes: Any) -> list[str]:
    ids = [f"{prefix}-{n:05d}" for n in range(count)]
    for start in range(0, count, 250):
        await asyncio.gather(*(client.create_run(parked, None, run_id=run_id,
                                                 attributes=attributes)
                               for run_id in ids[start:start + 250]))
    return ids


async def _all_suspended(client: Client, where: str, count: int, timeout: float = 120) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while await client.count_runs(f"{where} and status = 'suspended'") < count:
        assert asyncio.get_running_loop().time() < deadline, "runs did not all suspend"
        await asyncio.sleep(0.5)


async def test_a_batch_cancels_2000_runs_by_query_and_a_rerun_changes_nothing(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows, concurrency=128):
        async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows,
                          read_model_dir=tmp_path / "rm") as client:
            await _create(client, 2000, "bad", deploy="bad")
            await _create(client, 20, "good", deploy="good")
            await _all_suspended(client, "deploy = 'bad'", 2000)
            dry = await client.cancel_where("deploy = 'bad'", dry_run=True)
            report = await dry.result(timeout=120)
            assert report["matched"] == 2000 and len(report["first"]) == 20
            assert report["done"] == 0 and await client.count_runs("status = 'cancelled'") == 0
            handle = await client.cancel_where("deploy = 'bad'", reason="bad deploy",
                                               batch_id="bad-deploy")
            seen = []
            while not (progress := await handle.progress()).matching_done or (
                    progress.done + progress.refused < progress.matched):
                seen.append(progress.done)
                await asyncio.sleep(0.2)
            report = await handle.result(timeout=120)
            assert (report["matched"], report["done"], report["refused"]) == (2000, 2000, 0)
            assert report["rate_per_s"] and report["rate_per_s"] > 0
            # Each partition's owner cancels its runs in its own time: the last run sent
            # may be cancelled before others of other partitions (here 1,384 of 2,000 once).
            async def all_cancelled() -> bool:
                return await client.count_runs(
                    "deploy = 'bad' and status = 'cancelled'") == 2000
            await until(all_cancelled, "the 2,000 runs cancelled", 120)
            assert await client.count_runs("deploy = 'good' and status = 'suspended'") == 20
            run = await client.describe("bad-00042")
            assert run.error_message == "bad deploy"
            before = len(await client.journal(batch_run_id("bad-deploy")))
            again = await cli("runs", "cancel", "--where", "deploy = 'bad'", "--batch-id",
                              "bad-deploy", "--reason", "bad deploy", "--json",
                              bootstrap=bootstrap, namespace=namespace, cache=tmp_path / "c")
            assert again.code == 0, again.err
            assert json.loads(again.out)["done"] == 2000  # (the same batch's report)
            assert len(await client.journal(batch_run_id("bad-deploy"))) == before
    projection = await fold(bootstrap, namespace)
    cancels = [i for i in projection.history["bad-00007"]
               if isinstance(i.record, ev.RunCancelRequested)]
    assert [c.record.envelope.request_id for c in cancels] == [  # type: ignore[union-attr]
        "batch/bad-deploy/bad-00007"]


async def test_a_batch_reports_refusals_and_skips_runs_created_after_it_began(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows):
        async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows,
                          read_model_dir=tmp_path / "rm") as client:
            ids = await _create(client, 6, "r", team="t1")
            await _all_suspended(client, "team = 't1'", 6)
            # A confirmation answered no: nothing sent, exit 1 (it exited 130, an interrupt's).
            declined = await cli("runs", "cancel", "--where", "team = 't1'", stdin="n\n",
                                 bootstrap=bootstrap, namespace=namespace, cache=tmp_path / "c")
            assert declined.code == 1, declined
            assert declined.err.strip().endswith("aborted: nothing sent"), declined
            await client.signal(ids[0], "go")  # it completes: a cancel is refused
            await status_when(client, ids[0], RunStatus.completed)
            result = await cli("runs", "signal", "go", "--where", "team = 't1'",
                               "--payload", '"now"', "--yes", "--json", bootstrap=bootstrap,
                               namespace=namespace, cache=tmp_path / "c")
            assert result.code == 0, result.err
            report = json.loads(result.out)
            assert (report["matched"], report["done"], report["refused"]) == (6, 5, 1)
            assert report["refusals"][0]["run_id"] == ids[0]
            assert "ended" in report["refusals"][0]["reason"]
            # Nothing matches: nothing to confirm, nothing sent (it asked, and with no
            # terminal said "aborted" and exited 130).
            none = await cli("runs", "cancel", "--where", "team = 'nobody'",
                             bootstrap=bootstrap, namespace=namespace, cache=tmp_path / "c")
            assert (none.code, none.err.strip()) == (
                0, "no run matches \"team = 'nobody'\": nothing sent"), none
            # Its JSON has every key a batch's report has (it had five of them); an empty
            # batch id is refused (it skipped the confirmation and began a new batch).
            shape = await cli("runs", "cancel", "--where", "team = 'nobody'", "--json",
                              bootstrap=bootstrap, namespace=namespace, cache=tmp_path / "c")
            assert set(json.loads(shape.out)) == set(report), shape
            empty = await cli("runs", "cancel", "--where", "team = 't1'", "--batch-id", "",
                              bootstrap=bootstrap, namespace=namespace, cache=tmp_path / "c")
            assert empty.code == 2 and empty.err.strip().startswith(
                "error: a batch id is 1 to 100 of"), empty
            for run_id in ids[1:]:
                await status_when(client, run_id, RunStatus.completed)
            late = await _create(client, 1, "late", team="t1")
            handle = await client.resume_where("team = 't1'", dry_run=True)
            assert (await handle.result(timeout=60))["matched"] == 7
            bad = await cli("runs", "cancel", "--where", "team = ", "--yes",
                            bootstrap=bootstrap, namespace=namespace, cache=tmp_path / "c")
            assert bad.code != 0 and "position" in bad.err
            assert late


async def test_a_run_with_a_cancel_pending_already_is_counted_done(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """Its handler in a long step, the run holds a cancel already: the batch's cancel meets
    it, and the run is being cancelled, as the batch asks. Before, the report counted it
    refused, with the reason "refused"."""
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows):
        async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows,
                          read_model_dir=tmp_path / "rm") as client:
            for n in range(2):
                await client.create_run(stepping, None, run_id=f"step-{n}",
                                        attributes={"grp": "s"})
            await status_when(client, "step-1", RunStatus.running)
            await client.cancel("step-0", reason="first")
            result = await cli("runs", "cancel", "--where", "grp = 's'", "--yes", "--json",
                               bootstrap=bootstrap, namespace=namespace, cache=tmp_path / "c")
            assert result.code == 0, result.err
            report = json.loads(result.out)
            assert (report["matched"], report["done"], report["refused"]) == (2, 2, 0), report
            for n in range(2):
                await status_when(client, f"step-{n}", RunStatus.cancelled)
            assert (await client.describe("step-0")).error_message == "first"


async def test_a_batch_acts_on_the_rounds_it_matched_not_on_their_lineage(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """Round 0's id is its lineage's, and a request naming it reaches the latest round: a
    batch matching a round 0 that handed off (`round = 0`) cancelled the live round, which
    the query did not match, and reported the cancel as unanswered after its wait."""
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows):
        async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows,
                          read_model_dir=tmp_path / "rm") as client:
            await client.create_run(handing, 0, run_id="lin", attributes={"team": "h"})
            await status_when(client, "lin~1", RunStatus.suspended)
            first = await client.cancel_where("team = 'h' and round = 0", reason="r0")
            report = await first.result(timeout=90)
            assert (report["matched"], report["done"], report["refused"]) == (0, 0, 0)
            assert (await client.describe("lin~1")).status is RunStatus.suspended
            live = await client.cancel_where("team = 'h'", reason="all")
            report = await live.result(timeout=90)
            assert (report["matched"], report["done"], report["refused"]) == (1, 1, 0)
            await status_when(client, "lin~1", RunStatus.cancelled)


async def test_a_batch_counts_each_lineage_once_whatever_its_rounds(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """Two lineages of 12 rounds: only each live round is a target. Rounds after the first
    that handed off were matched too: the first ones refused the cancel (ended), and those
    sorted after the live round were answered `duplicate` and counted as done (matched 22,
    done 18, refused 2, for two runs cancelled)."""
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows):
        async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows,
                          read_model_dir=tmp_path / "rm") as client:
            for lineage in ("x", "y"):
                await client.create_run(relaying, 0, run_id=lineage)
            await _all_suspended(client, "flow = 'batch-relaying'", 2)
            assert await client.count_runs("flow = 'batch-relaying'") == 24
            # What `runs cancel --where` asks to confirm: the batch's targets (it said 24).
            assert await batch_operations.count_matches(
                bootstrap=bootstrap, namespace=namespace, where="flow = 'batch-relaying'") == 2
            batch = await client.cancel_where("flow = 'batch-relaying'", reason="all")
            report = await batch.result(timeout=90)
            assert [report[k] for k in ("matched", "sent", "done", "refused")] == [2, 2, 2, 0]
            for lineage in ("x", "y"):
                await status_when(client, f"{lineage}~11", RunStatus.cancelled)


BAD_BATCHES = [
    ({"where": 5}, "a batch's where is text, not int"),
    ({"reason": 12}, "a batch's reason is text, not int"),
    ({"operation": "signal", "signal": "bad name"}, "a batch's signal: signal name"),
    ({"operation": "signal", "signal": "go", "signal_payload_json": "{no"},
     "signal_payload_json is not JSON"),
]


async def test_a_batch_payload_no_client_sends_fails_before_any_step(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """Created by name or by a plain producer (a client checks what it sends): the batch
    fails at once, naming the field; it failed in the matching, or at its first send, or
    signalled a name no wait takes."""
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows), \
            Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        for n, (fields, why) in enumerate(BAD_BATCHES):
            payload = {"batch_id": f"bad{n}", "operation": "cancel", "where": "team = 'x'",
                       **fields}
            if n % 2:
                await produce_plain(bootstrap, journal, f"batch-bad{n}", plain_request(
                    "run.create-requested", f"batch-bad{n}", flow="runstream.batch",
                    payload_json=json.dumps(payload)))
            else:
                await client.create_run("runstream.batch", payload, run_id=f"batch-bad{n}")
            await status_when(client, f"batch-bad{n}", RunStatus.failed)
            run = await client.describe(f"batch-bad{n}")
            assert run.error_type == "BatchInvalid" and why in (run.error_message or ""), run
            assert await client.journal(f"batch-bad{n}") == ()  # (no step ran)


async def test_a_chunks_request_to_a_run_gone_since_its_match_is_answered_at_once(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """A run matched, then gone before its request reached it (it expired, and its tombstone
    went: nothing of it is left): the chunk's send finds no run in its read model and says
    so, beside a run that takes its request. It waited the whole ANSWER_WAIT_S for an answer
    no run would record, then called the request sent, unconfirmed."""
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows) as worker, \
            Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        [live] = await _create(client, 1, "gone-beside", team="g")
        await _all_suspended(client, "team = 'g'", 1)
        io = WorkerBatchIO(worker)
        spec = BatchSpec(batch_id="gone", operation="cancel", where="team = 'g'")
        started = time.monotonic()
        async with io.session():
            sent = await _send(io, spec, None, [live, "gone-since-its-match"])
        assert time.monotonic() - started < ANSWER_WAIT_S / 3, sent
        assert (sent["done"], sent["refused"]) == (1, [("gone-since-its-match",
                                                        "no such run")]), sent
        await status_when(client, live, RunStatus.cancelled)


async def test_a_batch_no_worker_starts_ends_the_command_in_one_line(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    # (no worker up: it printed "matched 0+" twice a second for an hour, and with --json
    # nothing at all)
    began = time.monotonic()
    alone = await cli("runs", "cancel", "--where", "team = 't1'", "--yes", "--batch-id",
                      "nw1", "--timeout", "3", "--json", bootstrap=bootstrap,
                      namespace=namespace, cache=tmp_path / "c")
    assert time.monotonic() - began < 60
    line = one_line_error(alone)
    assert "batch nw1 was not started within 3s" in line and "is one up?" in line, line
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows):
        again = await cli("runs", "cancel", "--where", "team = 't1'", "--batch-id", "nw1",
                          "--json", bootstrap=bootstrap, namespace=namespace,
                          cache=tmp_path / "c")
    assert again.code == 0, again.err
    assert json.loads(again.out)["matched"] == 0
