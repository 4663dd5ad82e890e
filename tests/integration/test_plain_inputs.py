"""What a plain producer writes from schemas/ alone that no client door lets through, on a
real broker: the owner answers each, and its writer is told (a handle on the request raises
CreateRejected), where before the run was admitted and then failed, or nothing answered:

- a create whose payload is not JSON (empty, NaN) or is over the payload limit: rejected
  (payload-invalid), for a flow the worker registers and for one it does not;
- a signal-with-start whose signal no wait can take (its payload not JSON, its name not a
  name): rejected (signal-invalid);
- a signal or an update whose name no wait can take: refused, and the run goes on.
The same in the TestEnvironment: tests/unit/test_plain_inputs_env.py."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from runstream import Client, CreateRejected, Flow, FlowContext, RunStatus
from runstream.engine.client.handle import RunHandle
from runstream.engine.journal import events as ev
from tests.integration.support import all_ready, fold, status_when, until
from tests.integration.test_lifetime import plain_request, worker

waiter = Flow("plain-inputs-waiter")


@waiter.handler
async def _waiter(ctx: FlowContext, payload: Any) -> Any:
    return {"payload": payload, "signal": await ctx.wait_for("go")}


async def _write(bootstrap: str, journal: str, client: Client, record_type: str,
                 run_id: str, key: str | None = None, **fields: Any) -> RunHandle:
    """The request as a plain producer writes it; a handle on it, as on a Client's own."""
    request_id = uuid.uuid4().hex
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        sent = await producer.send_and_wait(
            journal, plain_request(record_type, run_id, request_id=request_id, **fields),
            key=(key or run_id).encode(), headers=[("rs-type", record_type.encode())])
    finally:
        await producer.stop()
    return RunHandle(client, run_id=run_id, flow=None, partition=sent.partition,
                     request_offset=sent.offset, request_id=request_id)


async def _rejected(handle: RunHandle) -> CreateRejected:
    with pytest.raises(CreateRejected) as caught:
        await handle.admitted(timeout=30)
    return caught.value


async def test_a_plain_producers_invalid_inputs_are_answered(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with worker(bootstrap, namespace, tmp_path / "w", [waiter]) as w, \
            Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        await until(lambda: all_ready(w), "the worker claimed every partition")

        async def create(run_id: str, flow: str, payload_json: str) -> CreateRejected:
            return await _rejected(await _write(bootstrap, journal, client,
                                                "run.create-requested", run_id, flow=flow,
                                                payload_json=payload_json))

        empty = await create("empty", waiter.name, "")
        assert (empty.reason, empty.detail) == (
            "payload-invalid", f"the payload of flow {waiter.name!r} is not JSON: ''")
        nan = await create("nan", "registered-nowhere", '{"amount": NaN}')
        assert nan.reason == "payload-invalid" and "is not JSON" in nan.detail
        rnd = await _rejected(await _write(bootstrap, journal, client, "run.create-requested",
                                           "lin~3", key="lin", lineage_id="lin",
                                           flow=waiter.name, payload_json="null"))
        assert rnd.reason == "run-id-invalid"  # (a later round is made by a handoff alone)
        big = await create("big", "registered-nowhere", '"' + "b" * 600_000 + '"')
        assert big.reason == "payload-invalid" and "over the 524288-byte limit" in big.detail

        async def start(run_id: str, name: str, payload_json: str) -> CreateRejected:
            return await _rejected(await _write(
                bootstrap, journal, client, "run.signal-with-start-requested", run_id,
                flow=waiter.name, payload_json="null", signal_name=name,
                signal_payload_json=payload_json))

        bad_json = await start("sws-json", "go", "{bad")
        assert (bad_json.reason, bad_json.detail) == (
            "signal-invalid", "the payload of signal 'go' is not JSON")
        bad_name = await start("sws-name", "two words", "1")
        assert bad_name.reason == "signal-invalid" and "not allowed (' ')" in bad_name.detail

        # The ids are free: a valid create of each is admitted and runs.
        made = await client.create_run(waiter.name, 7, run_id="empty")
        await status_when(client, "empty", RunStatus.suspended, timeout=30)
        await _write(bootstrap, journal, client, "run.signal-sent", "empty", name="two words",
                     payload_json="1")
        await _write(bootstrap, journal, client, "run.update-requested", "empty",
                     name="bad name!", payload_json="1")
        await client.signal("empty", "go", 8)
        assert await made.result(timeout=30) == {"payload": 7, "signal": 8}
        [named] = [h for h in (await fold(bootstrap, namespace)).history["empty"]
                   if isinstance(h.record, ev.RunSignalSent) and h.record.name == "two words"]
        assert named.verdict.value == "refused"  # (no wait is named so)
        [update] = [h for h in (await fold(bootstrap, namespace)).history["empty"]
                    if isinstance(h.record, ev.RunUpdateRequested)]
        assert update.verdict.value == "refused"  # (accepted, its caller was never answered)
