"""Input limits against a real broker: invalid requests are refused by the client and the
CLI with one clear line, and nothing reaches the journal (no worker needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiokafka import TopicPartition

from runstream import Client
from runstream.engine.errors import InvalidInput
from runstream.engine.journal.input_limits import NameInvalid, PayloadTooLarge, RunIdInvalid
from runstream.engine.kafka.reader import reader_consumer
from tests.conftest import TEST_JOURNAL_PARTITIONS
from tests.integration.test_cli import cli, one_line_error


async def journal_ends(bootstrap: str, topic: str) -> list[int]:
    consumer = reader_consumer(bootstrap)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(TEST_JOURNAL_PARTITIONS)]
        ends = await consumer.end_offsets(tps)
        return [ends[tp] for tp in tps]
    finally:
        await consumer.stop()


async def test_invalid_requests_never_reach_the_journal(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNSTREAM_MAX_PAYLOAD_BYTES", "1000")
    big = {"blob": "x" * 1000}
    async with Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        refusals = [
            (RunIdInvalid, client.create_run("checkout", {}, run_id="has space")),
            (RunIdInvalid, client.create_run("checkout", {}, run_id="r" * 201)),
            (RunIdInvalid, client.create_run("checkout", {}, run_id="lineage~1")),
            (NameInvalid, client.create_run("check out", {})),
            (PayloadTooLarge, client.create_run("checkout", big)),
            (RunIdInvalid, client.signal("bad\nid", "go")),
            (NameInvalid, client.signal("r1", "go/now")),
            (PayloadTooLarge, client.signal("r1", "go", big)),
            (RunIdInvalid, client.cancel("\x00")),
            (InvalidInput, client.cancel("r1", reason="r" * 5000)),
            (PayloadTooLarge, client.resume("r1", resolution="skip", position=0, digest="d",
                                            result=big)),
        ]
        for error, call in refusals:
            with pytest.raises(error):
                await call
    assert await journal_ends(bootstrap, journal) == [0] * TEST_JOURNAL_PARTITIONS

    async def run(*args: str) -> str:
        return one_line_error(await cli(*args, bootstrap=bootstrap, namespace=namespace,
                                        cache=tmp_path / "cache"))

    assert "run id 'a b' has characters that are not allowed (' ')" in await run(
        "run", "create", "checkout", "--id", "a b")
    assert "signal name 'no good' has" in await run("run", "signal", "r1", "no good")
    assert "over the 1000-byte limit" in await run(
        "run", "create", "checkout", "--payload", '"' + "y" * 2000 + '"')
    assert "authority name 'a.b' must be" in await run(
        "run", "create", "checkout", "--authority-name", "a.b")
    assert await journal_ends(bootstrap, journal) == [0] * TEST_JOURNAL_PARTITIONS
