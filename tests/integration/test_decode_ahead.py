"""A fold whose records a second process read and decoded (engine.kafka.decode_ahead) ends
in the store an in-place fold makes: same records, same dead letters, same running hashes,
key for key; a child's error reaches the fold as one line, and a fold that stops early
leaves no child behind. Against the real broker."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from bench.journal import generate
from runstream.engine.errors import RunstreamError
from runstream.engine.kafka.decode_ahead import DecodeAhead, ReadSpec
from runstream.engine.ops.rebuild import FoldSpec, fold_into
from runstream.projections.fold import compare
from runstream.projections.store import ProjectionStore
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
                await produce_bad(producer, journal, make_bad(kind, rng), partition)
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
    assert dead == len(KINDS) * TEST_JOURNAL_PARTITIONS  # (every poison record counted)


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
    with pytest.raises(RunstreamError, match="RUNSTREAM_DECODE_AHEAD_MIN must be a whole"):
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
