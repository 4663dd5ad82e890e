"""A fold whose records a second process read and decoded (engine.kafka.decode_ahead) ends
in the store an in-place fold makes: same records, same dead letters, same running hashes,
key for key; a child's error reaches the fold as one line, and a fold that stops early
leaves no child behind. Against the real broker."""

from __future__ import annotations

import asyncio
import random
import time
from contextlib import aclosing
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from bench.journal import generate
from runstream.engine.errors import RunstreamError
from runstream.engine.journal import encode
from runstream.engine.kafka.decode_ahead import DecodeAhead, ReadSpec, _examined
from runstream.engine.kafka.reader import read_batches
from runstream.engine.ops.rebuild import FoldSpec, fold_into
from runstream.projections.fold import compare
from runstream.projections.poison import Poison
from runstream.projections.store import ProjectionStore
from tests.builders import create
from tests.conftest import TEST_JOURNAL_PARTITIONS
from tests.integration.poison_records import KINDS, make_bad, produce_bad

RUNS = 400  # whole 3-step checkouts: 7 records each


async def _journal_with_poison(bootstrap: str, journal: str) -> int:
    """Generated runs, then poison of every kind on every partition, then more runs; the
    records written."""
    written = (await generate(bootstrap, journal, TEST_JOURNAL_PARTITIONS,
                              RUNS * 7 + TEST_JOURNAL_PARTITIONS)).records
    rng = random.Random(19)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=2_000_000)
    await producer.start()
    try:
        for partition in range(TEST_JOURNAL_PARTITIONS):
            for kind in KINDS:
                await produce_bad(producer, journal, make_bad(kind, rng, partition), partition)
                written += 1
            # Kafka allows a header without a value
            await producer.send_and_wait(journal, b"\x07not-avro", key=b"ghost",
                                         headers=[("trace", None)], partition=partition)
            written += 1
    finally:
        await producer.stop()
    return written


@pytest.mark.parametrize("keep_records", [False, True], ids=["states", "with-records"])
async def test_a_fold_decoded_ahead_is_the_fold_decoded_in_place(
    bootstrap: str, journal: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    keep_records: bool,
) -> None:
    written = await _journal_with_poison(bootstrap, journal)
    monkeypatch.setenv("RUNSTREAM_DECODE_AHEAD_MIN", "1")
    here = await fold_into(FoldSpec(bootstrap, journal, tmp_path / "here", scratch=True,
                                    keep_records=keep_records, decode_ahead=False))
    ahead = await fold_into(FoldSpec(bootstrap, journal, tmp_path / "ahead", scratch=True,
                                     keep_records=keep_records))
    assert not here.decoded_ahead and ahead.decoded_ahead
    assert here.records == ahead.records == written
    assert ahead.reached == here.reached
    assert ahead.final_hashes == here.final_hashes and all(ahead.final_hashes.values())
    left, right = ProjectionStore(tmp_path / "here"), ProjectionStore(tmp_path / "ahead")
    try:
        compared, differences = compare(left, right)
        dead = sum(left.partition(p).dead_letters for p in range(TEST_JOURNAL_PARTITIONS))
    finally:
        left.close()
        right.close()
    assert compared > RUNS * 5 and differences == []
    assert dead == (len(KINDS) + 1) * TEST_JOURNAL_PARTITIONS  # (every poison record)


async def test_small_backlogs_and_shards_fold_in_place(
    bootstrap: str, journal: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    await generate(bootstrap, journal, TEST_JOURNAL_PARTITIONS, 70 + TEST_JOURNAL_PARTITIONS)
    monkeypatch.setenv("RUNSTREAM_DECODE_AHEAD_MIN", "1000")
    small = await fold_into(FoldSpec(bootstrap, journal, tmp_path / "small", scratch=True))
    monkeypatch.setenv("RUNSTREAM_DECODE_AHEAD_MIN", "0")
    never = await fold_into(FoldSpec(bootstrap, journal, tmp_path / "never", scratch=True))
    assert not small.decoded_ahead and not never.decoded_ahead
    assert small.final_hashes == never.final_hashes
    monkeypatch.setenv("RUNSTREAM_DECODE_AHEAD_MIN", "seventy")
    with pytest.raises(RunstreamError, match="RUNSTREAM_DECODE_AHEAD_MIN='seventy' is not a whole"):
        await fold_into(FoldSpec(bootstrap, journal, tmp_path / "bad", scratch=True))


async def test_a_childs_error_reaches_the_fold_and_an_early_stop_ends_the_child(
    bootstrap: str, journal: str,
) -> None:
    missing = DecodeAhead(ReadSpec(bootstrap, journal + "-no-such-topic", None, {}, None,
                                   None))
    try:
        with pytest.raises(RunstreamError, match="does not exist"):
            async for _ in missing.batches():
                pass
    finally:
        missing.close()
    assert not missing.running

    await generate(bootstrap, journal, TEST_JOURNAL_PARTITIONS,
                   3_000 * 7 + TEST_JOURNAL_PARTITIONS)
    reading = DecodeAhead(ReadSpec(bootstrap, journal, None, {}, None, None))
    try:
        batches = reading.batches()
        first = await anext(batches)
        assert first and all(len(row) == 5 for row in first)
        await batches.aclose()
        assert reading.running  # (still sending: it had more to read)
    finally:
        reading.close()
    assert not reading.running


async def test_a_reader_held_up_by_its_caller_is_not_timed_out(bootstrap: str, journal: str
                                                                ) -> None:
    """The no-progress deadline counts the broker's time, not the time a caller (a child
    waiting for its fold to take frames) holds a batch."""
    await generate(bootstrap, journal, TEST_JOURNAL_PARTITIONS,
                   2_000 * 7 + TEST_JOURNAL_PARTITIONS)
    read = 0
    async with aclosing(read_batches(bootstrap, journal, timeout=0.5)) as batches:
        async for batch in batches:
            read += len(batch)
            await asyncio.sleep(0.7)
    assert read == 2_000 * 7 + TEST_JOURNAL_PARTITIONS


async def test_a_child_whose_fold_died_ends_itself(bootstrap: str, journal: str) -> None:
    """The fold's process gone without ending its child (kill -9): the child's next write
    finds the pipe closed and the child exits, whatever it was waiting for."""
    await generate(bootstrap, journal, TEST_JOURNAL_PARTITIONS,
                   3_000 * 7 + TEST_JOURNAL_PARTITIONS)
    reading = DecodeAhead(ReadSpec(bootstrap, journal, None, {}, None, None))
    try:
        child = reading._child  # (what a dead parent leaves: its end of the pipe closed)
        assert child.stdout is not None
        child.stdout.close()
        deadline = time.monotonic() + 30
        while child.poll() is None:
            assert time.monotonic() < deadline, "the orphaned child did not exit"
            await asyncio.sleep(0.1)
        assert child.returncode != 0
    finally:
        reading.close()


def test_a_record_sent_without_its_fields_is_examined_without_a_key_check() -> None:
    """One the child decoded and msgspec could not rebuild here: the child checked its key
    and headers, and sent neither; it is examined again from its bytes, never made a
    missing-key dead letter for the key it was not sent with."""
    value, _ = encode(create("r-1", "q-1"))
    examined = _examined(value, None, None)
    assert not isinstance(examined, Poison) and examined.envelope.run_id == "r-1"
    keyless = _examined(value, [("rs-type", b"run.create-requested")], None)
    assert isinstance(keyless, Poison) and keyless.reason == "missing-key"
