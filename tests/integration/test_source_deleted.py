"""The read model's journal source against records the broker deleted: a read that needs
them fails with the one line naming the partition, the missing offsets and the horizon
(engine.kafka.restore.deleted_line); a read at or past the log start goes on. The source
asks the log start only then (its consumer does not reset silently), not on every read."""

from __future__ import annotations

import pytest
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete

from runstream.engine.kafka.restore import RecordsDeleted
from runstream.engine.readmodel.source import JournalSource

pytestmark = pytest.mark.integration


async def _produce(bootstrap: str, topic: str, count: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for n in range(count):
            await producer.send_and_wait(topic, b"%d" % n, key=b"k", partition=0)
    finally:
        await producer.stop()


async def _delete_below(bootstrap: str, topic: str, offset: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_records({TopicPartition(topic, 0): RecordsToDelete(offset)},
                                   timeout_ms=10_000)
    finally:
        await admin.close()


async def test_a_read_below_the_log_start_fails_with_its_line_and_one_above_goes_on(
        bootstrap: str, journal: str) -> None:
    await _produce(bootstrap, journal, 10)
    await _delete_below(bootstrap, journal, 6)
    source = JournalSource(bootstrap, journal, timeout=20)
    await source.start()
    try:
        with pytest.raises(RecordsDeleted) as failed:
            async for _ in source.read({0: 2}, {0: 10}):
                pass
        assert str(failed.value).startswith(
            "partition 0: records 2..5 are needed but the broker deleted them (the "
            "journal's retention; its log now starts at offset 6)"), str(failed.value)
        # The same source reads on from the log start after the refusal.
        offsets = [record.offset async for record in source.read({0: 6}, {0: 10})]
        assert offsets == [6, 7, 8, 9]
        assert [r.value for r in [r async for r in source.read({0: 8}, {0: 10})]] == [
            b"8", b"9"]
    finally:
        await source.close()
