"""How a worker tells a broker that is down (wait) from settings that can never work
(exit with one line): engine.worker.connect, against local sockets, no broker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiokafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

from runstream.engine.errors import AccessDenied, BrokerConnectionFailed
from runstream.engine.kafka.connection import KafkaSecurity
from runstream.engine.kafka.reader import TopicMissing
from runstream.engine.worker import Worker, connect
from runstream.engine.worker.connect import Reconnector, diagnose_failure
from tests.integration.support import nothing_listens


@pytest.fixture
async def hangs_up() -> AsyncIterator[str]:
    """A listener that closes every connection at once (what a TLS listener does to a
    plaintext client)."""
    async def close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(close, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


async def test_nothing_listening_is_worth_waiting_for() -> None:
    found = await diagnose_failure(KafkaConnectionError("Unable to bootstrap"),
                                   nothing_listens(), KafkaSecurity())
    assert not found.permanent and not found.suspect
    assert found.line.startswith("nothing listens at")


async def test_a_missing_topic_is_waited_for_and_denied_access_is_not() -> None:
    missing = await diagnose_failure(TopicMissing("ns.journal", "x:1"), "x:1", KafkaSecurity())
    assert not missing.permanent
    denied = await diagnose_failure(TopicAuthorizationFailedError(), "x:1", KafkaSecurity())
    assert denied.permanent and denied.line.startswith("not authorized")


async def test_retries_until_the_attempt_succeeds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connect, "FIRST_DELAY_S", 0.01)
    reconnector = Reconnector(nothing_listens(), KafkaSecurity(), "t",
                              lambda: False)
    tries = []

    async def attempt() -> int:
        tries.append(1)
        if len(tries) < 3:
            raise KafkaConnectionError("Unable to bootstrap")
        return 42

    assert await reconnector.until_done("connecting", attempt) == 42
    assert reconnector.failures == 2


async def test_a_listener_that_always_hangs_up_ends_with_one_line(
        hangs_up: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connect, "FIRST_DELAY_S", 0.01)
    reconnector = Reconnector(hangs_up, KafkaSecurity(), "t", lambda: False)

    async def attempt() -> None:
        raise KafkaConnectionError("Unable to bootstrap")

    with pytest.raises(BrokerConnectionFailed, match="probably requires TLS"):
        await reconnector.until_done("connecting", attempt)
    assert reconnector.failures == connect.SUSPECT_STRIKES


async def test_access_denied_is_raised_at_once() -> None:
    reconnector = Reconnector("127.0.0.1:1", KafkaSecurity(), "t", lambda: False)

    async def attempt() -> None:
        raise AccessDenied("not authorized: no")

    with pytest.raises(AccessDenied):
        await reconnector.until_done("connecting", attempt)


async def test_stopping_ends_the_wait() -> None:
    reconnector = Reconnector(nothing_listens(), KafkaSecurity(), "t",
                              lambda: True)

    async def attempt() -> None:
        raise KafkaConnectionError("Unable to bootstrap")

    with pytest.raises(asyncio.CancelledError):
        await reconnector.until_done("connecting", attempt)


async def test_a_stop_while_connecting_ends_the_worker_without_the_attempt_s_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGTERM during a broker restart: aiokafka may swallow the cancel and the attempt end
    with its connection error instead (the chaos harness saw such a worker exit 3). The stop
    wins; without a stop, the error still ends serve_until."""
    worker = Worker(flows=[], data_dir=tmp_path / "w", bootstrap_servers=nothing_listens(),
                    namespace="t", relay=False)
    stop = asyncio.Event()

    async def cut_short() -> None:
        await stop.wait()
        await asyncio.sleep(0.05)  # (abandon's cancel lands here and is swallowed)
        raise KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 1)]")

    async def swallowing_cancel() -> None:
        try:
            await cut_short()
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)
            raise KafkaConnectionError("Unable to bootstrap") from None

    monkeypatch.setattr(worker, "run", swallowing_cancel)
    asyncio.get_running_loop().call_later(0.05, stop.set)
    await asyncio.wait_for(worker.serve_until(stop), 10)  # returns: no error

    failing = Worker(flows=[], data_dir=tmp_path / "f", bootstrap_servers="127.0.0.1:1",
                     namespace="t", relay=False)

    async def permanent() -> None:
        raise BrokerConnectionFailed("nothing listens at 127.0.0.1:1")

    monkeypatch.setattr(failing, "run", permanent)
    with pytest.raises(BrokerConnectionFailed):
        await asyncio.wait_for(failing.serve_until(asyncio.Event()), 10)
