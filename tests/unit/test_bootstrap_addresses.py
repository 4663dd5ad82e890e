"""Names a deployment gives that end up in Kafka: bootstrap addresses as a diagnosis reads
them (the worker's and the CLI's read the host as the port without one: "invalid literal
for int()"), namespaces, and the requests topic of an authority (Kafka refuses a topic name
over 249 characters: `topics create` made the namespace's other topics first)."""

from __future__ import annotations

import pytest

from runstream import InvalidInput
from runstream.engine.broker.probe import parse_bootstrap
from runstream.engine.config import host_port, requests_topic, resolve_namespace


@pytest.mark.parametrize(("address", "expected"), [
    ("broker:9093", ("broker", 9093)), ("broker", ("broker", 9092)),
    ("127.0.0.2", ("127.0.0.2", 9092)), ("[::1]:9093", ("::1", 9093)),
    ("[::1]", ("::1", 9092)), ("::1", ("::1", 9092)),
])
def test_a_bootstrap_address_s_host_and_port(address: str, expected: tuple[str, int]) -> None:
    assert host_port(address) == expected
    assert parse_bootstrap(f"{address},other") == [expected, ("other", 9092)]  # (the probe's)


@pytest.mark.parametrize("namespace", ["a b", "a/b", "..", ".", "x" * 201, "orders:eu"])
def test_a_namespace_no_topic_or_directory_can_be_named_after_is_refused(
        namespace: str) -> None:
    with pytest.raises(InvalidInput, match="namespace"):
        resolve_namespace(namespace)


def test_namespaces_made_so_far_are_taken() -> None:
    for namespace in ("runstream", "demo-1796599311", "tbench-abc123-w1-0a1b2c3d",
                      "t-0123abcd", "old.dotted", "n" * 200):
        assert resolve_namespace(namespace) == namespace


def test_a_requests_topic_over_kafka_s_length_is_refused_before_it_is_made() -> None:
    assert requests_topic("n" * 200) == "n" * 200 + ".requests"
    with pytest.raises(InvalidInput, match="270 characters"):
        requests_topic("n" * 200, "a" * 60)
