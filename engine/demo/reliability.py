"""The demo's reliability part: bad input refused before it is produced, and poison records
on the journal set aside in the dead-letter topic while the good runs go on."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from runstream.engine.client.client import Client
from runstream.engine.config import journal_topic
from runstream.engine.demo.flows import CheckoutIn, checkout
from runstream.engine.errors import InvalidInput
from runstream.engine.journal import encode
from runstream.engine.journal import events as ev
from runstream.engine.journal.records import decision_envelope
from runstream.engine.ops.deadletters import DeadLetterList, format_rows, list_dead_letters
from runstream.engine.worker.kafka_driver import make_producer, send_acked

Echo = Callable[[str], None]
DEAD_LETTERS_TIMEOUT_S = 60.0


def _poison() -> list[tuple[str, bytes, bytes, list[tuple[str, bytes]]]]:
    """(what, key, value, headers): three records no reader can apply."""
    completed = ev.RunCompleted(
        envelope=decision_envelope(ev.RunCompleted.TYPE, "never-created",
                                   lineage_id="never-created", epoch=1, source_id="demo",
                                   source_seq=1, now_ms=0),
        result_json='"forged"')
    value, headers = encode(completed)
    return [
        ("garbage bytes", b"poison-1", b"\x07not avro at all", []),
        ("truncated Avro", b"poison-2", value[: len(value) // 2], list(headers)),
        ("a decision for a run that never existed", b"never-created", value, list(headers)),
    ]


async def show_reliability(client: Client, *, bootstrap: str, namespace: str,
                           echo: Echo) -> None:
    echo("\nbad input and poison records")
    try:
        await client.create_run(checkout, CheckoutIn(order_id="x", amount=1),
                                run_id="an id with spaces")
    except InvalidInput as refused:
        echo(f"  create_run(run_id='an id with spaces'): refused before producing: {refused}")
    producer = await make_producer(bootstrap, name="demo-poison")
    try:
        for what, key, value, headers in _poison():
            await send_acked(producer, journal_topic(namespace), key=key, value=value,
                             headers=headers)
            echo(f"  produced {what} into the journal")
    finally:
        await producer.stop()
    after = await client.create_run(checkout, CheckoutIn(order_id="after-poison", amount=2),
                                    run_id="after-poison")
    await after.result(timeout=60)
    echo("  a run created after them completed: the owners skipped the poison and went on")
    listed = await _until_listed(bootstrap, namespace, 3)
    echo(f"  runstream dead-letters list: {listed.total} records, each copied by its "
         f"partition's owner before its projection moved past it")
    for line in format_rows(listed):
        echo(f"    {line}")


async def _until_listed(bootstrap: str, namespace: str, count: int) -> DeadLetterList:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEAD_LETTERS_TIMEOUT_S
    while True:
        listed = await list_dead_letters(bootstrap=bootstrap, namespace=namespace)
        if listed.total >= count or loop.time() > deadline:
            return listed
        await asyncio.sleep(0.5)
