"""Updates on a real broker (issue 21 item 2): accepted and replied through every door (a
Flow object, a flow name, the CLI, a plain producer's request answered to a client that
repeats its request id), rejected by the validator and by the handler, a duplicate
request id answered by its first outcome, refused once the run settled and when it settles
without answering; and across a kill -9 of the owner between the request and the outcome."""

from __future__ import annotations

import asyncio
import io
import json
import signal
import struct
import uuid
from pathlib import Path

import fastavro
import pytest

from runstream import Client, ResultTimeout, RunStatus, UpdateRefused, UpdateRejected
from runstream.engine.journal import events as ev
from runstream.projections.partitioning import run_partition
from tests.conftest import TEST_JOURNAL_PARTITIONS
from tests.integration.support import WorkerProcess, fold, running_worker, status_when, until
from tests.integration.test_cli import cli
from tests.integration.test_lifetime import SCHEMAS, produce_plain
from tests.integration.update_flows import (
    VALIDATED,
    approval,
    busy,
    counter,
    entity,
    far,
    flows,
    hops,
    ordered,
    rounds,
    typed,
)

APP = "tests.integration.update_flows:flows"


async def test_updates_through_every_door(bootstrap: str, namespace: str, journal: str,
                                          tmp_path: Path) -> None:
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows):
        async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows,
                          read_model_dir=tmp_path / "rm") as knows, \
                Client(bootstrap_servers=bootstrap, namespace=namespace,
                       read_model_dir=tmp_path / "rm2") as nameless:
            await knows.create_run(approval, {"count": 4}, run_id="doors")
            assert await knows.update("doors", "approve", {"amount": 5}) == {"total": 5}
            assert await nameless.update("doors", "approve", {"amount": 7}) == {"total": 12}
            out = await cli("run", "update", "doors", "approve", "--payload",
                            '{"amount": 1}', "--json", bootstrap=bootstrap,
                            namespace=namespace, cache=tmp_path / "c")
            assert out.code == 0, out.err
            assert json.loads(out.out)["reply"] == {"total": 13}
            request_id = uuid.uuid4().hex
            await produce_plain(bootstrap, journal, "doors", _with_request_id(
                "doors", request_id, '{"amount": 2}'), record_type="run.update-requested")
            # A client repeating the producer's request id gets that update's outcome.
            assert await nameless.update("doors", "approve", {"amount": 999},
                                         request_id=request_id, timeout=30) == {"total": 15}
            await status_when(knows, "doors", RunStatus.completed)


def _with_request_id(run_id: str, request_id: str, payload_json: str, *,
                     name: str = "approve") -> bytes:
    """A plain producer's update request, from schemas/ alone, with its own request id."""
    registry = json.loads((SCHEMAS / "registry.json").read_text())
    [entry] = [e for e in registry["records"]
               if e["type"] == "run.update-requested" and not e.get("archived")]
    named: dict[str, object] = {}
    fastavro.parse_schema(json.loads((SCHEMAS / "envelope.avsc").read_text()), named)
    schema = fastavro.parse_schema(json.loads((SCHEMAS / entry["file"]).read_text()), named)
    datum = {"envelope": {"type": "run.update-requested", "run_id": run_id,
                          "lineage_id": run_id, "request_id": request_id,
                          "timestamp_ms": 0}, "name": name, "payload_json": payload_json}
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, schema, datum)
    return b"\x00" + struct.pack(">I", entry["id"]) + buffer.getvalue()


async def test_rejections_duplicates_and_refusals(bootstrap: str, namespace: str,
                                                  journal: str, tmp_path: Path) -> None:
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows):
        async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows,
                          read_model_dir=tmp_path / "rm") as client:
            await client.create_run(approval, {"count": 2, "leave_one": True}, run_id="r")
            with pytest.raises(UpdateRejected, match="over the limit of 100"):
                await client.update("r", "approve", {"amount": 500})
            with pytest.raises(UpdateRejected, match="vetoed by the handler"):
                await client.update("r", "approve", {"amount": 1, "veto": True})
            first = await client.update("r", "approve", {"amount": 3}, request_id="same")
            again = await client.update("r", "approve", {"amount": 50}, request_id="same")
            assert first == again == {"total": 3}
            # The request ids are deduplicated per partition: "same" on another run of it is
            # refused at once (it waited for ever for an outcome the first request had).
            other = next(f"other-{n}" for n in range(1000) if run_partition(
                f"other-{n}", TEST_JOURNAL_PARTITIONS) == run_partition(
                "r", TEST_JOURNAL_PARTITIONS))
            await client.create_run(approval, {"count": 1}, run_id=other)
            with pytest.raises(UpdateRefused, match="used before for another request"):
                await client.update(other, "approve", {"amount": 1}, request_id="same",
                                    timeout=60)
            assert await client.update(other, "approve", {"amount": 2}) == {"total": 2}
            # The run now takes one more, never answers it and completes: the caller
            # hears UpdateRefused, never silence.
            with pytest.raises(UpdateRefused, match="without answering it"):
                await client.update("r", "approve", {"amount": 4}, timeout=60)
            with pytest.raises(UpdateRefused, match="has ended"):
                await client.update("r", "approve", {"amount": 4})
            await (await client.create_run(approval, {"count": 2}, run_id="r2")).admitted(
                timeout=60)
    async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows,
                      read_model_dir=tmp_path / "rm") as client:
        # No owner answers now (the worker stopped): the caller hears what it waited for,
        # not that the run "did not settle".
        with pytest.raises(ResultTimeout, match=r"^update 'approve' of run r2 was not "
                                                r"answered within 2s \(last seen: "):
            await client.update("r2", "approve", {"amount": 1}, timeout=2)
    projection = await fold(bootstrap, namespace)
    kinds = [i.record.TYPE for i in projection.history["r"] if i.record is not None]
    assert kinds.count(ev.UpdateAccepted.TYPE) == 3 and kinds.count(ev.UpdateRejected.TYPE) == 1
    assert kinds.count(ev.UpdateCompleted.TYPE) == 2
    assert kinds.count(ev.RunUpdateRequested.TYPE) == 6


async def test_an_update_survives_a_kill_of_its_owner(bootstrap: str, namespace: str,
                                                      journal: str, tmp_path: Path) -> None:
    marker, release = tmp_path / "held", tmp_path / "release"
    a = WorkerProcess(bootstrap, namespace, tmp_path / "a", "a", tmp_path / "fx", app=APP)
    a.start()
    b: WorkerProcess | None = None
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows,
                          read_model_dir=tmp_path / "rm") as client:
            await client.create_run(approval, {"count": 1, "hold": str(marker),
                                               "release": str(release)}, run_id="k")
            answer = asyncio.ensure_future(
                client.update("k", "approve", {"amount": 9}, request_id="k-1", timeout=120))
            for _ in range(600):
                if marker.exists():
                    break
                await asyncio.sleep(0.1)
            assert marker.exists(), a.log_text()
            a.signal(signal.SIGKILL)  # taken, its reply not journaled yet
            release.touch()
            b = WorkerProcess(bootstrap, namespace, tmp_path / "b", "b", tmp_path / "fx",
                              app=APP).start()
            assert await asyncio.wait_for(answer, 120) == {"total": 9}
            assert await client.update("k", "approve", {"amount": 1},
                                       request_id="k-1") == {"total": 9}
            await status_when(client, "k", RunStatus.completed)
        assert len(marker.read_text().split()) == 2  # the step ran again on b
    finally:
        a.stop()
        if b is not None:
            b.stop()


async def test_a_new_owner_validates_an_update_its_dead_owner_was_validating(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    marker = tmp_path / "validating"
    a = WorkerProcess(bootstrap, namespace, tmp_path / "a", "a", tmp_path / "fx", app=APP)
    a.start()
    b: WorkerProcess | None = None
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows,
                          read_model_dir=tmp_path / "rm") as client:
            handle = await client.create_run(approval, {"count": 1}, run_id="v")
            await handle.admitted(timeout=60)
            answer = asyncio.ensure_future(client.update(
                "v", "approve", {"amount": 4, "slow_marker": str(marker)}, timeout=120))
            for _ in range(600):
                if marker.exists():
                    break
                await asyncio.sleep(0.05)
            assert marker.exists(), a.log_text()
            a.signal(signal.SIGKILL)  # mid-validation: no verdict journaled
            b = WorkerProcess(bootstrap, namespace, tmp_path / "b", "b", tmp_path / "fx",
                              app=APP).start()
            assert await asyncio.wait_for(answer, 120) == {"total": 4}
        assert len(marker.read_text().split()) == 2  # validated again, by b at its claim
    finally:
        a.stop()
        if b is not None:
            b.stop()
    projection = await fold(bootstrap, namespace)
    verdicts = [i.record for i in projection.history["v"]
                if isinstance(i.record, ev.UpdateAccepted | ev.UpdateRejected)]
    assert [type(v) for v in verdicts] == [ev.UpdateAccepted]


async def test_an_update_carried_by_a_handoff_and_taken_there_is_answered_not_refused(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    """The caller sees its round end while the next round holds the update taken and not
    yet answered: it follows it there. Before, it was refused ("ended without answering
    it") for as long as the next round took to answer."""
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows,
                   read_model_dir=tmp_path / "rm") as client:
        await client.create_run(rounds, 0, run_id="taken")
        await status_when(client, "taken", RunStatus.suspended)
        assert await asyncio.wait_for(client.update("taken", "approve", None), 60) == "round 1"


async def test_an_update_answered_by_a_round_that_handed_off_since_is_returned(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    """The reply is in the round that took the update; the lineage's latest round, which
    the read model names by the lineage's id, never answers it: the caller (and a retry
    with the same request id) waited for ever."""
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows,
                   read_model_dir=tmp_path / "rm") as client:
        await client.create_run(counter, 0, run_id="counting")
        await status_when(client, "counting", RunStatus.suspended)
        first = await client.update("counting", "add", 1, request_id="add-1", timeout=30)
        assert first == {"was": 0}
        await until(lambda: _round_of(client, "counting", 1), "round 1 suspended")
        assert await client.update("counting", "add", 1, request_id="add-1",
                                   timeout=30) == first
        # Round 0 by its own id once it handed off (refused unsent): the same update too.
        assert await client.update("counting~0", "add", 1, request_id="add-1",
                                   timeout=30) == first
        assert await client.update("counting", "add", 1, request_id="add-2",
                                   timeout=30) == {"was": 1}


async def test_an_update_validated_for_longer_than_a_round_lives_is_answered(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    """The lineage hands off every tenth of a second, its validator takes half a second:
    the verdict goes to the round holding the update when it is ready (or again to the next
    one, when it reached a round that ended meanwhile), and the validator runs once. Before,
    each round ran the validator again, each verdict reached a round that had ended, and the
    update was never judged: the caller waited until the lineage ran out of rounds."""
    VALIDATED.clear()
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows,
                   read_model_dir=tmp_path / "rm") as client:
        await client.create_run(entity, {"round": 0, "last": 300}, run_id="entity")
        await until(lambda: _past_round(client, "entity", 2), "the lineage handing off")
        reply = await client.update("entity", "bump", {"n": 1}, request_id="bump-1",
                                    timeout=30)
        result = await client.get_handle("entity").result(timeout=30, follow=True)
        assert result["got"] == {"n": 1} and reply == {"round": result["round"]}
        assert VALIDATED == [{"n": 1}]


async def _past_round(client: Client, lineage: str, number: int) -> bool:
    return (await client.describe(lineage)).round >= number


async def _round_of(client: Client, lineage: str, number: int) -> bool:
    run = await client.describe(lineage)
    return run.round == number and run.status is RunStatus.suspended


async def test_an_update_to_a_lineage_past_two_handoffs_is_answered_by_its_latest_round(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    """As in the TestEnvironment (tests/unit/test_updates_env.py), which refused it."""
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows,
                   read_model_dir=tmp_path / "rm") as client:
        await client.create_run(far, 0, run_id="far")
        await status_when(client, "far~2", RunStatus.suspended)
        assert await client.update("far", "ask", None, timeout=60) == {"answered_by_round": 2}


async def test_an_update_carried_by_two_handoffs_between_two_looks_is_answered(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    """Round 0 hands off the buffered update, round 1 hands it off again before the
    caller looks: the round between had cleared it, and the caller (and a retry with the
    same request id) was told "refused" for an update round 2 answered."""
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows,
                   read_model_dir=tmp_path / "rm") as client:
        await client.create_run(hops, 0, run_id="h")
        await status_when(client, "h", RunStatus.suspended)
        asked = asyncio.create_task(client.update("h", "ask", None, request_id="ask-1",
                                                  timeout=60))
        await until(lambda: _buffered(client, "h"), "round 0 holds the update")
        await client.signal("h", "go")
        await status_when(client, "h~2", RunStatus.suspended)
        assert await asked == {"answered_by_round": 2}
        assert await client.update("h", "ask", None, request_id="ask-1",
                                   timeout=60) == {"answered_by_round": 2}


async def _buffered(client: Client, run_id: str) -> bool:
    return bool((await client.describe(run_id)).signals)


async def test_an_update_whose_answer_left_the_outcome_index_between_two_looks_gets_it(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A caller looks every POLL_S (made long here, as a slow catch-up under load makes it):
    its first look found no answer, and by the next one more than MAX_UPDATE_OUTCOMES other
    updates were answered, the run's index no longer held its own, and it waited for ever
    (or its timeout) while the answer stood in the journal."""
    from runstream.engine.client import updates as client_updates
    from runstream.engine.journal.records import request_envelope
    monkeypatch.setattr(client_updates, "POLL_S", 4.0)
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows,
                   read_model_dir=tmp_path / "rm") as client, \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows,
                   read_model_dir=tmp_path / "rm2") as other:
        await client.create_run(busy, None, run_id="busy")
        await status_when(client, "busy", RunStatus.suspended)
        target = asyncio.create_task(client.update("busy", "inc", "target",
                                                   request_id="target", timeout=30))
        await asyncio.sleep(1)  # (its first look, before the answer)
        await other.signal("busy", "go")
        await other.send_requests([ev.RunUpdateRequested(
            envelope=request_envelope(ev.RunUpdateRequested.TYPE, "busy",
                                      request_id=f"other-{n}", now_ms=0),
            name="inc", payload_json='"other"') for n in range(80)])
        await until(lambda: _indexed_without(other, "busy", "target"),
                    "the run's outcome index dropped the target's")
        assert (await target)["payload"] == "target"


async def _indexed_without(client: Client, run_id: str, request_id: str) -> bool:
    outcomes = (await client.describe(run_id)).update_outcomes
    return len(outcomes) >= 64 and all(o.request_id != request_id for o in outcomes)


async def test_updates_are_taken_in_the_order_they_arrived_whatever_their_validation(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    """The worker judges updates concurrently: u1's validator is slow, u2's verdict came
    first and u2 went first (the TestEnvironment, judging one at a time, kept the order)."""
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows,
                   read_model_dir=tmp_path / "rm") as client:
        await client.create_run(ordered, None, run_id="o")
        await status_when(client, "o", RunStatus.suspended)
        first = asyncio.create_task(client.update("o", "put", {"n": 1, "slow": True},
                                                  request_id="u1", timeout=60))
        await asyncio.sleep(0.3)
        second = asyncio.create_task(client.update("o", "put", {"n": 2}, request_id="u2",
                                                   timeout=60))
        await until(lambda: _buffered_count(client, "o", 2), "both updates accepted")
        await client.signal("o", "go")
        assert (await first, await second) == (1, 2)
        assert await client.get_handle("o").result(timeout=60) == [1, 2]


async def _buffered_count(client: Client, run_id: str, count: int) -> bool:
    return len((await client.describe(run_id)).signals) >= count


async def test_a_validator_s_rejection_is_one_line_and_an_async_check_rejects(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    """Through every door: a pydantic error's lines, one line of reason; a coroutine a
    validator returned (it was dropped, and every update accepted), a rejection."""
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows):
        async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows,
                          read_model_dir=tmp_path / "rm") as knows, \
                Client(bootstrap_servers=bootstrap, namespace=namespace,
                       read_model_dir=tmp_path / "rm2") as nameless:
            await knows.create_run(typed, None, run_id="typed")
            for client in (knows, nameless):
                with pytest.raises(UpdateRejected, match="is async"):
                    await client.update("typed", "later", {"x": 1}, timeout=30)
                with pytest.raises(UpdateRejected) as bad:
                    await client.update("typed", "discount", {"percent": "lots"}, timeout=30)
                assert bad.value.reason.startswith("percent: Input should be a valid integer")
                assert "\n" not in str(bad.value)
            out = await cli("run", "update", "typed", "discount", "--payload", "[1, 2]",
                            bootstrap=bootstrap, namespace=namespace, cache=tmp_path / "c")
            assert out.code != 0 and out.err.count("\n") == 1, out.err
            assert "Input should be a valid dictionary" in out.err
            await produce_plain(bootstrap, journal, "typed", _with_request_id(
                "typed", uuid.uuid4().hex, '{"code": 1}', name="discount"),
                record_type="run.update-requested")
            assert await nameless.update("typed", "discount",
                                         {"percent": 1, "code": "x", "stop": True},
                                         timeout=30) == {"percent": 1, "code": "x", "stop": True}
    projection = await fold(bootstrap, namespace)
    reasons = [i.record.reason for i in projection.history["typed"]
               if isinstance(i.record, ev.UpdateRejected)]
    assert len(reasons) == 6 and all("\n" not in r for r in reasons), reasons
