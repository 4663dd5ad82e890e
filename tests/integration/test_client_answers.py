"""What a Client's `result()` answers when the reducer made another outcome of a settlement
than its record says, against a real broker: the journal is written record by record (as an
owner would), and the client's tail and read model answer.

- A completion or a handoff journaled after run.timed-out is a failure with RunTimedOut
  (projections.deadlines): the client said the handler's value, or a handoff that never
  happened (and waited for ever following it).
- Round 0 of a lineage whose later round was cancelled handed off all the same: its
  `result()` raised RunCancelled (the client described the lineage's latest round).
- A run whose create was rejected: `get_handle(...).result()` waited for ever.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from runstream import Client, CreateRejected, HandedOff, ResultTimeout, RunTimedOut
from runstream.engine.client import schedules as client_schedules
from runstream.engine.journal import events as ev
from runstream.engine.kafka.requests_topic import RelayMisconfigured
from runstream.projections.partitioning import partition_for
from runstream.projections.state import RunStatus
from tests.builders import create
from tests.integration.test_read_model import PARTITIONS, Journal

TIMEOUT_MS = 5


async def _timed_out_run(writer: Journal, run_id: str) -> None:
    """Created with a timeout, activated, then timed out by its owner."""
    owner = writer.owners[partition_for(run_id, PARTITIONS)]
    at = await writer.send(create(run_id, f"q-{run_id}"))
    await writer.send(owner.decide(ev.RunCreated, run_id=run_id, request_id=f"q-{run_id}",
                                   flow="checkout", payload_json="{}", request_offset=at,
                                   run_timeout_ms=TIMEOUT_MS))
    await writer.send(owner.decide(ev.RunActivated, run_id=run_id, mode="new", activation=1))
    await writer.send(owner.decide(ev.RunTimedOut, run_id=run_id, deadline_ms=0,
                                   run_timeout_ms=TIMEOUT_MS, grace_ms=1000))


@pytest.mark.parametrize("waiting", ["before", "after"], ids=["tail", "read model"])
async def test_a_settlement_after_a_timeout_is_the_timeout(
        bootstrap: str, namespace: str, journal: str, waiting: str) -> None:
    async with Journal(bootstrap, journal) as writer, Client(
            bootstrap_servers=bootstrap, namespace=namespace) as client:
        done, handed = f"done-{waiting}", f"handed-{waiting}"
        await _timed_out_run(writer, done)
        await _timed_out_run(writer, handed)
        waits = []
        if waiting == "before":  # (the tail passes the records after the waits began)
            waits = [asyncio.create_task(client.get_handle(run_id).result(timeout=30))
                     for run_id in (done, handed)]
            await asyncio.sleep(1.0)
        for run_id, record in ((done, ev.RunCompleted), (handed, ev.RunHandedOff)):
            owner = writer.owners[partition_for(run_id, PARTITIONS)]
            body = ({"result_json": '"the handler\'s value"'} if record is ev.RunCompleted
                    else {"next_run_id": f"{run_id}~1", "round": 1, "payload_json": "{}"})
            await writer.send(owner.decide(record, run_id=run_id, **body))
        if waits:
            for wait in waits:
                with pytest.raises(RunTimedOut):
                    await wait
        for run_id in (done, handed):
            with pytest.raises(RunTimedOut):
                await client.get_handle(run_id).result(timeout=30)
        with pytest.raises(RunTimedOut):  # (it followed a round that never began)
            await client.get_handle(handed).result(timeout=30, follow=True)
        assert (await client.describe(handed)).error_type == "RunTimedOut"


async def test_round_zero_handed_off_though_a_later_round_was_cancelled(
        bootstrap: str, namespace: str, journal: str) -> None:
    async with Journal(bootstrap, journal) as writer, Client(
            bootstrap_servers=bootstrap, namespace=namespace) as client:
        lineage = "lineage-c"
        partition = partition_for(lineage, PARTITIONS)
        owner = writer.owners[partition]
        await writer.run(lineage, steps=0, settle=False)
        await writer.send(owner.decide(ev.RunHandedOff, run_id=lineage,
                                       next_run_id=f"{lineage}~1", round=1, payload_json="{}"))
        for record in (owner.decide(ev.RunActivated, run_id=f"{lineage}~1", mode="new",
                                    activation=1),
                       owner.decide(ev.RunCancelled, run_id=f"{lineage}~1", reason="stop")):
            await writer.send(dataclasses.replace(record, envelope=dataclasses.replace(
                record.envelope, lineage_id=lineage)), partition=partition)
        assert (await client.describe(lineage)).status is RunStatus.cancelled
        assert await client.get_handle(lineage).result(timeout=30) == HandedOff(
            f"{lineage}~1", 1)


@pytest.mark.parametrize("waiting", ["before", "after"], ids=["tail", "read model"])
async def test_attaching_to_a_run_whose_create_was_rejected_raises(
        bootstrap: str, namespace: str, journal: str, waiting: str) -> None:
    async with Journal(bootstrap, journal) as writer, Client(
            bootstrap_servers=bootstrap, namespace=namespace) as client:
        gone, kept = f"order-{waiting}", f"kept-{waiting}"
        waits = {}
        if waiting == "before":
            waits = {run_id: asyncio.create_task(client.get_handle(run_id).result(timeout=30))
                     for run_id in (gone, kept)}
            await asyncio.sleep(1.0)
        for run_id in (gone, kept):
            owner = writer.owners[partition_for(run_id, PARTITIONS)]
            if run_id == kept:  # created, then a repeat of its create rejected: it stays
                await writer.run(run_id, steps=0, settle=False)
            await writer.send(create(run_id, f"again-{run_id}"))
            await writer.send(owner.decide(ev.RunCreateRejected, run_id=run_id,
                                           request_id=f"again-{run_id}",
                                           reason="payload-invalid", field="payload",
                                           existing_value="", requested_value="not a number"))
        await writer.send(writer.owners[partition_for(kept, PARTITIONS)].decide(
            ev.RunCompleted, run_id=kept, result_json='"kept"'))
        with pytest.raises(CreateRejected, match="payload-invalid"):
            await (waits[gone] if waits else client.get_handle(gone).result(timeout=30))
        assert await (waits[kept] if waits else client.get_handle(kept).result(
            timeout=30)) == "kept"


async def test_waits_with_no_worker_up_end_in_a_runstream_timeout(
        bootstrap: str, namespace: str, journal: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # (they raised the builtin TimeoutError with no message)
    monkeypatch.setattr(client_schedules, "ANSWER_TIMEOUT_S", 1.0)
    async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        handle = await client.create_run("checkout", {})
        with pytest.raises(ResultTimeout, match="was not admitted within 1s"):
            await handle.admitted(timeout=1)
        with pytest.raises(ResultTimeout, match="schedule nightly had no answer to its create"):
            await client.create_schedule("nightly", "checkout", every=60)


async def test_a_timeout_names_the_status_of_a_run_suspended_before_the_client_came(
        bootstrap: str, namespace: str, journal: str) -> None:
    # (the tail starts past the run's records, so it said "last seen: nothing yet")
    run_id = "parked"
    async with Journal(bootstrap, journal) as writer:
        owner = writer.owners[partition_for(run_id, PARTITIONS)]
        await writer.run(run_id, steps=0, settle=False)
        await writer.send(owner.decide(ev.RunSuspended, run_id=run_id, reason="event",
                                       event_name="go", position=0))
    async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        with pytest.raises(ResultTimeout, match=r"within 1s \(last seen: suspended, "
                                                r"waiting for signal 'go' \(no timeout\)\)$"):
            await client.get_handle(run_id).result(timeout=1)
    async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        with pytest.raises(ResultTimeout, match=r"within 1s \(last seen: nothing yet\)$"):
            await client.get_handle("never-created").result(timeout=1)


async def test_a_timeout_of_a_run_not_admitted_names_the_owner_that_has_not_answered(
        bootstrap: str, namespace: str, journal: str) -> None:
    # (it said "no worker has claimed partition N; start a worker" whatever the partition's
    # state: `run status` names the owner that claimed it)
    run_id = "unanswered"
    partition = partition_for(run_id, PARTITIONS)
    async with Journal(bootstrap, journal) as writer:
        await writer.send(create(run_id, "q-unanswered"))
    async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        with pytest.raises(ResultTimeout, match=(
                rf"last seen: pending, not admitted yet: partition {partition}'s owner "
                rf"worker-{partition} has not answered its create")):
            await client.get_handle(run_id).result(timeout=1)


async def test_a_failed_start_of_the_requests_producer_leaves_waits_in_progress_going(
        bootstrap: str, namespace: str, journal: str) -> None:
    # (the client closed its tail under them: they waited for ever)
    async with Journal(bootstrap, journal) as writer:
        client = Client(bootstrap_servers=bootstrap, namespace=namespace,
                        authority_name="billing")  # (no requests topic: RelayMisconfigured)
        try:
            await writer.run("waited-on", steps=1, settle=False)
            waiting = asyncio.create_task(client.get_handle("waited-on").result(timeout=30))
            await asyncio.sleep(1.0)
            with pytest.raises(RelayMisconfigured):
                await client.create_run("checkout", {})
            owner = writer.owners[partition_for("waited-on", PARTITIONS)]
            await writer.send(owner.decide(ev.RunCompleted, run_id="waited-on",
                                           result_json='"done"'))
            assert await waiting == "done"
        finally:
            await client.close()
