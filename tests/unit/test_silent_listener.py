"""A listener that accepts connections and never answers (a wrong port, a proxy, a broker
hung mid-start): the one line a client's start ends with names how long it waited. It said
"within 10s" after 41-53 s: aiokafka's own request timeout (40 s) ran first, unnamed. Now a
start still waiting after a few seconds is probed meanwhile, and ends at the probe's
silence (engine.kafka.connection.watched_start)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaProducer

from runstream.engine.errors import BrokerConnectionFailed
from runstream.engine.kafka import connection
from runstream.engine.kafka.connection import (
    diagnose,
    is_refused,
    start_client,
    watched_start,
)
from runstream.engine.worker.connect import diagnose_failure
from tests.integration.support import nothing_listens, silent_listener


@pytest.fixture
async def silent() -> AsyncIterator[str]:
    """Accepts every connection, reads what comes, answers nothing."""
    async with silent_listener() as address:
        yield address


async def test_a_diagnosis_of_a_silent_listener_names_both_waits(silent: str) -> None:
    found = await diagnose(silent, timeout=0.2, waited=40.3)
    assert str(found) == (f"{silent} did not answer a Kafka request over PLAINTEXT within "
                          "0.2s, nor in the 40s of the attempt before: check "
                          "--security-protocol and the address")
    alone = await diagnose(silent, timeout=0.2)
    assert str(alone) == (f"{silent} did not answer a Kafka request over PLAINTEXT within "
                          "0.2s: check --security-protocol and the address")


async def test_a_client_start_against_a_silent_listener_says_how_long_it_waited(
        silent: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection, "DIAGNOSIS_TIMEOUT_S", 0.2)
    producer = AIOKafkaProducer(bootstrap_servers=silent, request_timeout_ms=1800)
    with pytest.raises(BrokerConnectionFailed) as failed:
        await start_client(producer, silent)
    assert str(failed.value) == (
        f"{silent} did not answer a Kafka request over PLAINTEXT within 0.2s, nor in the 2s "
        "of the attempt before: check --security-protocol and the address")


async def test_a_start_held_by_a_silent_listener_ends_at_its_probe_not_its_timeout(
        silent: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With aiokafka's own request timeout (40 s), a start that has not bootstrapped after
    SILENT_AFTER_S is probed meanwhile, and the probe's silence ends it: a CLI command
    took 51 s to say so, a worker 45 s for its first warning."""
    monkeypatch.setattr(connection, "SILENT_AFTER_S", 0.3)
    monkeypatch.setattr(connection, "DIAGNOSIS_TIMEOUT_S", 0.2)
    producer = AIOKafkaProducer(bootstrap_servers=silent)  # (request_timeout_ms 40000)
    started = time.monotonic()
    with pytest.raises(BrokerConnectionFailed) as failed:
        await start_client(producer, silent)
    assert time.monotonic() - started < 5.0
    assert str(failed.value) == (
        f"{silent} did not answer a Kafka request over PLAINTEXT within 0.5s: check "
        "--security-protocol and the address")


async def test_a_watched_start_gives_up_only_when_no_address_answers(
        silent: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Beside a silent address, one that refuses does not answer either: given up on. (One
    that answers lets the start go on: tests/integration/test_silent_bootstrap.py.)"""
    monkeypatch.setattr(connection, "SILENT_AFTER_S", 0.2)
    monkeypatch.setattr(connection, "DIAGNOSIS_TIMEOUT_S", 0.2)
    closed = nothing_listens()
    with pytest.raises(BrokerConnectionFailed, match=f"^{silent} did not answer"):
        await watched_start(asyncio.sleep(30), f"{closed},{silent}", None)


async def test_a_watched_start_cancelled_ends_its_start_whatever_it_swallows() -> None:
    """aiokafka's close swallows a cancel: cancelled once, the start went on and finished
    after its caller had stopped the client (engine.worker.connect.abandon)."""
    events: list[str] = []

    async def swallowing() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            events.append("swallowed")
        await asyncio.sleep(0.3)
        events.append("started")

    watching = asyncio.create_task(watched_start(swallowing(), "127.0.0.1:9", None))
    await asyncio.sleep(0.05)
    watching.cancel()
    with pytest.raises(asyncio.CancelledError):
        await watching
    await asyncio.sleep(0.5)
    assert events == ["swallowed"]


async def test_a_watched_start_cancelled_while_its_start_swallows_it_is_cancelled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the probe, a cancel was passed into the start; one that swallows it and returns
    (aiokafka's close swallows a cancel) lost it: the caller went on as if started (a
    worker's stop waited for ever on its snapshot task, which looped on)."""
    monkeypatch.setattr(connection, "SILENT_AFTER_S", 0.01)
    monkeypatch.setattr(connection, "DIAGNOSIS_TIMEOUT_S", 0.2)

    async def swallowing() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            pass  # (and returns: "started")

    watching = asyncio.create_task(watched_start(swallowing(), nothing_listens(), None))
    await asyncio.sleep(0.3)  # (the probe found nothing listening: the start goes on)
    watching.cancel()
    with pytest.raises(asyncio.CancelledError):
        await watching


async def test_a_diagnosis_is_the_first_address_that_does_not_refuse(silent: str) -> None:
    # (it probed every address and reported the first's reason: the silent ones after it
    # were each waited for in vain; then it stopped at the first, refused or not, and a
    # broker down first in the list hid what was wrong at the next)
    closed, also_closed = nothing_listens(), nothing_listens()
    started = time.monotonic()
    later = await diagnose(f"{silent},{closed}", timeout=0.2, waited=0.01)
    assert time.monotonic() - started < 2.5  # (the silent one alone, once)
    assert str(later) == (f"{silent} did not answer a Kafka request over PLAINTEXT within "
                          "0.2s: check --security-protocol and the address")  # (no "0s")
    passed = await diagnose(f"{closed},{silent}", timeout=0.2)
    assert str(passed).startswith(f"{silent} did not answer a Kafka request"), passed
    refused = await diagnose(f"{closed},{also_closed}", timeout=0.2)
    assert str(refused).startswith(f"nothing listens at {closed}: "), refused


async def test_a_worker_stops_on_settings_wrong_behind_a_broker_that_is_down() -> None:
    """A listener that hangs up on every connection (TLS expected, say) is wrong settings a
    worker stops on; behind an address where nothing listens, it retried for ever."""
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    closer = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        alone = await diagnose_failure(OSError("bootstrap failed"), closer, None)
        behind = await diagnose_failure(OSError("bootstrap failed"), f"{nothing_listens()},"
                                        f"{closer}", None)
    finally:
        server.close()
        await server.wait_closed()
    assert alone.suspect and behind == alone, (alone, behind)


def test_a_name_whose_every_address_refuses_is_refused() -> None:
    """asyncio's error when every address a name resolves to refuses (`localhost` with ::1
    and 127.0.0.1): a plain OSError, which a diagnosis stopped at as wrong where it passes
    a refusal, and whose line did not say that nothing listens."""
    both = OSError("Multiple exceptions: [Errno 111] Connect call failed ('::1', 9, 0, 0), "
                   "[Errno 111] Connect call failed ('127.0.0.1', 9)")
    mixed = OSError("Multiple exceptions: [Errno 111] Connect call failed ('::1', 9, 0, 0), "
                    "[Errno 113] Connect call failed ('10.0.0.9', 9)")
    assert is_refused(both) and is_refused(ConnectionRefusedError(111, "refused"))
    no_v6 = OSError("Multiple exceptions: [Errno 99] Cannot assign requested address, "
                    "[Errno 111] Connect call failed ('127.0.0.1', 9)")
    assert not is_refused(mixed) and not is_refused(OSError("Multiple exceptions: "))
    assert is_refused(no_v6)  # (::1 with IPv6 off)
    settings = connection.resolve_security(None)
    assert connection.explain(both, "localhost:9", settings, 1.0).startswith(
        "nothing listens at localhost:9: ")
