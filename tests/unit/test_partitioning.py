"""projections.partitioning agrees with the Kafka client's own murmur2 partitioner."""

from __future__ import annotations

import random

from aiokafka.partitioner import murmur2 as kafka_murmur2

from runstream.projections.partitioning import murmur2, partition_for, run_partition


def test_murmur2_matches_the_kafka_client_on_every_tail_length() -> None:
    rng = random.Random(17)
    keys = [b"", b"a", b"ab", b"abc", b"abcd", "ünïcode-run".encode()]
    keys += [rng.randbytes(rng.randrange(0, 80)) for _ in range(2000)]
    for key in keys:
        assert murmur2(key) == kafka_murmur2(key), key


def test_known_partitions_from_the_java_client() -> None:
    # Values the Java client's DefaultPartitioner gives for these keys (murmur2 test vectors
    # of org.apache.kafka.common.utils.UtilsTest, positive-masked).
    assert murmur2(b"21") & 0x7FFFFFFF == (-973932308) & 0x7FFFFFFF
    assert partition_for("order-1", 12) == (kafka_murmur2(b"order-1") & 0x7FFFFFFF) % 12


def test_every_round_of_a_lineage_shares_its_partition() -> None:
    for n in (3, 12, 64):
        assert run_partition("checkout-7~3", n) == run_partition("checkout-7", n)
