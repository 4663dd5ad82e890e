"""Signal, cancel and resume against a real broker, with no worker: the reducer alone
decides each request's verdict, and the client reads it back through the read model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runstream import CancelRefused, Client, ResumeRefused, RunNotFound, SignalRefused
from runstream.projections.state import MAX_SIGNALS
from tests.integration.test_cli import cli, one_line_error


async def _history_types(client: Client, run_id: str) -> list[str]:
    view = await (await client.read_model()).catch_up()
    return [entry.type for entry in view.history(run_id)]


async def test_signal_to_an_unknown_run_raises_run_not_found(
    bootstrap: str, namespace: str, journal: str
) -> None:
    async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        with pytest.raises(RunNotFound, match="no run 'ghost'"):
            await client.signal("ghost", "approval", {"ok": True})


async def test_signal_buffer_takes_64_then_refuses_and_dedupes_by_request_id(
    bootstrap: str, namespace: str, journal: str
) -> None:
    async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        await client.create_run("checkout", {"order_id": "s1"}, run_id="s1")
        offsets = [await client.signal("s1", "tick", {"i": i}) for i in range(MAX_SIGNALS - 1)]
        assert offsets == sorted(offsets) and len(set(offsets)) == MAX_SIGNALS - 1
        last = await client.signal("s1", "tick", {"i": "last"}, request_id="dup")
        again = await client.signal("s1", "tick", {"i": "last"}, request_id="dup")
        assert again > last  # a re-send of an accepted id is a new record, taken once
        assert len((await client.describe("s1")).signals) == MAX_SIGNALS
        with pytest.raises(SignalRefused) as refused:
            await client.signal("s1", "tick", {"i": "one too many"})
        assert refused.value.run_id == "s1" and refused.value.name == "tick"
        assert f"({MAX_SIGNALS})" in str(refused.value)
        run = await client.describe("s1")
    assert len(run.signals) == MAX_SIGNALS
    assert [s.request_id for s in run.signals].count("dup") == 1
    assert json.loads(run.signals[-1].payload_json) == {"i": "last"}


async def test_unsafe_cancel_is_refused_and_sends_nothing(
    bootstrap: str, namespace: str, journal: str
) -> None:
    async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        await client.create_run("checkout", {"order_id": "u1"}, run_id="u1")
        with pytest.raises(CancelRefused) as refused:
            await client.cancel("u1", reason="now!", unsafe=True)
        assert str(refused.value).startswith("unsafe_interrupt_unsupported:")
        assert "next durable call" in str(refused.value)
        assert (await client.describe("u1")).cancel_requested is None
        assert await _history_types(client, "u1") == ["run.create-requested"]


async def test_cancel_of_a_pending_run_is_recorded_once(
    bootstrap: str, namespace: str, journal: str
) -> None:
    async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        await client.create_run("checkout", {"order_id": "c1"}, run_id="c1")
        await client.cancel("c1", reason="customer left")
        await client.cancel("c1", reason="second thoughts")  # already requested: fine
        run = await client.describe("c1")
        with pytest.raises(RunNotFound):
            await client.cancel("nobody")
    assert run.cancel_requested == "customer left"  # the first reason stands
    assert (run.cancel_requested_by or "").startswith("client@")


async def test_resume_of_a_run_that_is_not_waiting_is_refused(
    bootstrap: str, namespace: str, journal: str
) -> None:
    async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        await client.create_run("checkout", {"order_id": "r1"}, run_id="r1")
        with pytest.raises(ResumeRefused) as refused:
            await client.resume("r1")
        with pytest.raises(RunNotFound):
            await client.resume("nobody")
        run = await client.describe("r1")
    assert refused.value.run_id == "r1"
    assert "the run is pending, not waiting" in str(refused.value)
    assert not run.resume_requested


async def test_cli_signal_cancel_and_resume(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async def run(*args: str) -> tuple[int, str, str]:
        done = await cli(*args, bootstrap=bootstrap, namespace=namespace,
                         cache=tmp_path / "cache")
        return done.code, done.out, done.err

    async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        await client.create_run("checkout", {"order_id": "k1"}, run_id="k1")

    code, out, err = await run("run", "signal", "k1", "approval", "--payload",
                               '{"ok": true}', "--request-id", "a1", "--json")
    assert code == 0, err
    sent = json.loads(out)
    assert sent["run_id"] == "k1" and sent["signal"] == "approval"
    assert isinstance(sent["offset"], int)
    code, out, err = await run("run", "signal", "k1", "approval", "--request-id", "a1")
    assert code == 0 and "delivered" in out, err

    bad = one_line_error(await cli("run", "signal", "k1", "approval", "--payload", "{oops",
                                   bootstrap=bootstrap, namespace=namespace))
    assert "--payload is not valid JSON" in bad
    missing = one_line_error(await cli("run", "signal", "nope", "approval",
                                       bootstrap=bootstrap, namespace=namespace))
    assert "no run 'nope'" in missing

    code, out, err = await run("run", "cancel", "k1", "--reason", "stop", "--json")
    assert code == 0, err
    assert json.loads(out)["cancel_requested"] == "stop"
    code, out, err = await run("run", "cancel", "k1")
    assert code == 0 and "cancel requested for run k1: stop" in out, err

    resume = one_line_error(await cli("run", "resume", "k1", bootstrap=bootstrap,
                                      namespace=namespace))
    assert "run k1 cannot be resumed: the run is pending, not waiting" in resume

    code, out, err = await run("run", "status", "k1", "--json")
    assert code == 0, err
    status = json.loads(out)
    assert status["signals"] == 1 and status["cancel_requested"] == "stop"
    assert status["note"].startswith("cancel requested: stop; not admitted yet")


async def test_a_signal_reusing_another_runs_request_id_is_refused_not_lost(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """Request ids are deduplicated per partition: a signal to run b with the id of a's
    signal is the partition's duplicate, and no run takes it. It returned an offset (and
    the CLI said delivered) as if b had."""
    from runstream.projections.partitioning import run_partition
    from tests.conftest import TEST_JOURNAL_PARTITIONS
    a = "same-part-a"
    b = next(f"same-part-b{n}" for n in range(1000) if run_partition(
        f"same-part-b{n}", TEST_JOURNAL_PARTITIONS) == run_partition(a, TEST_JOURNAL_PARTITIONS))
    async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        for run_id in (a, b):
            await client.create_run("checkout", {"order_id": run_id}, run_id=run_id)
        await client.signal(a, "approve", "alice", request_id="approval")
        assert await client.signal(a, "approve", "alice", request_id="approval")  # (a's own)
        with pytest.raises(SignalRefused, match="'approval' was used before"):
            await client.signal(b, "approve", "bob", request_id="approval")
        assert (await client.describe(b)).signals == ()
    line = one_line_error(await cli("run", "signal", b, "approve", "--request-id", "approval",
                                    bootstrap=bootstrap, namespace=namespace,
                                    cache=tmp_path / "cache"))
    assert "was used before for another request" in line
    async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        # A signal-with-start naming a run that does not exist: nothing took the signal,
        # nothing was created, and it said "no such run".
        home = run_partition(a, TEST_JOURNAL_PARTITIONS)
        fresh = next(f"same-part-c{n}" for n in range(1000)
                     if run_partition(f"same-part-c{n}", TEST_JOURNAL_PARTITIONS) == home)
        with pytest.raises(SignalRefused, match="'approval' was used before"):
            await client.signal_with_start("checkout", {"order_id": fresh}, run_id=fresh,
                                           signal="approve", request_id="approval")
        with pytest.raises(RunNotFound):
            await client.describe(fresh)
