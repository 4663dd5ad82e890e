"""A bootstrap list with a silent address (it accepts and never answers) beside a broker:
aiokafka tries the addresses in an order of its own, waiting its request timeout at the
silent one, and then starts from the broker. A start still waiting is probed after a few
seconds (engine.kafka.connection.watched_start): it gave up when the first address it
probed was silent, though the client would have started."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from runstream.engine.kafka import connection
from runstream.engine.kafka.connection import watched_start
from tests.integration.support import silent_listener


@pytest.fixture
async def silent_address() -> AsyncIterator[str]:
    async with silent_listener() as address:
        yield address


async def test_a_start_goes_on_while_another_address_answers(
        bootstrap: str, silent_address: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection, "SILENT_AFTER_S", 0.2)
    monkeypatch.setattr(connection, "DIAGNOSIS_TIMEOUT_S", 0.5)
    done: list[str] = []

    async def slow_start() -> None:  # (as aiokafka's, waiting at the silent one first)
        await asyncio.sleep(2.0)
        done.append("started")

    await watched_start(slow_start(), f"{silent_address},{bootstrap}", None)
    assert done == ["started"]
