"""Where a client's requests go (engine.kafka.requests_topic.choose_route), from the topics
the cluster lists: a namespace without a journal is runstream.TopicMissing, as every reader
of it says (a Client raised RelayMisconfigured, which code catching TopicMissing missed)."""

from __future__ import annotations

import pytest

import runstream
from runstream.engine.kafka.requests_topic import RelayMisconfigured, choose_route


def test_a_namespace_without_its_journal_is_topic_missing() -> None:
    with pytest.raises(runstream.TopicMissing, match=r"'ns\.journal' does not exist"):
        choose_route("ns", None, {"other.journal": 3}, "b:9092")


def test_the_journal_alone_is_direct_and_a_requests_topic_relays() -> None:
    assert choose_route("ns", None, {"ns.journal": 3}, "b").relayed is False
    route = choose_route("ns", None, {"ns.journal": 3, "ns.requests": 3}, "b")
    assert (route.topic, route.relayed, route.partitions) == ("ns.requests", True, 3)
    with pytest.raises(RelayMisconfigured, match="partitions"):
        choose_route("ns", None, {"ns.journal": 3, "ns.requests": 4}, "b")
