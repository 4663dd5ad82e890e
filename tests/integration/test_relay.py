"""Relay mode against a real broker: clients write only `<ns>.requests[.<authority>]`, the
relay (engine.worker.relay, run here next to in-process workers) forwards requests into the
journal and nothing else."""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from runstream import (
    Client,
    Flow,
    FlowContext,
    RequestNotRelayed,
    ResultTimeout,
    RunCancelled,
    RunFailed,
    Worker,
)
from runstream.engine.config import dead_letter_topic, requests_topic
from runstream.engine.journal import Envelope, decode, encode
from runstream.engine.journal import events as ev
from runstream.engine.kafka.admin import ensure_requests_topics
from runstream.engine.kafka.reader import read_partitions
from runstream.engine.worker.relay import Relay
from runstream.engine.worker.relay_judge import REASON_HEADER
from runstream.projections.partitioning import run_partition
from tests.conftest import TEST_JOURNAL_PARTITIONS
from tests.integration.support import until
from tests.integration.test_cli import cli, one_line_error

AUTHORITIES = {"team": frozenset({"email"})}
three = Flow("relay-three")
mailer = Flow("relay-mailer", capabilities={"email", "payments"})
collector = Flow("relay-collector")
executions: collections.Counter[str] = collections.Counter()  # (run id) -> step calls


def _count(run_id: str, step: str) -> str:
    executions[f"{run_id}/{step}"] += 1
    return step


@three.handler
async def _three(ctx: FlowContext, payload: dict[str, Any]) -> list[str]:
    return [await ctx.step(f"s{i}", _count, ctx.run_id, f"s{i}") for i in range(3)]


@mailer.handler
async def _mailer(ctx: FlowContext, payload: Any) -> str:
    await ctx.step("mail", _count, ctx.run_id, "mail", requires="email")
    return str(await ctx.step("charge", _count, ctx.run_id, "charge", requires="payments"))


@collector.handler
async def _collector(ctx: FlowContext, payload: dict[str, Any]) -> list[Any]:
    if payload.get("sleep"):
        await ctx.sleep(payload["sleep"])
    return [await ctx.wait_for("item") for _ in range(payload["count"])]


FLOWS = [three, mailer, collector]


@pytest.fixture
async def relayed(bootstrap: str, namespace: str, journal: str) -> AsyncIterator[str]:
    """The namespace's requests topics (`team` and an unconfigured `rogue` authority)."""
    made = await ensure_requests_topics(bootstrap, namespace, ["team", "rogue"])
    assert [t.partitions for t in made] == [TEST_JOURNAL_PARTITIONS] * 3
    yield namespace
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([t.name for t in made])
    finally:
        await admin.close()


@asynccontextmanager
async def engine(bootstrap: str, namespace: str, path: Path,
                 relay: Relay | None = None, relay_later: bool = False) -> AsyncIterator[Relay]:
    """An in-process worker and a relay next to it (as each worker will run one)."""
    worker = Worker(flows=FLOWS, data_dir=path, bootstrap_servers=bootstrap,
                    namespace=namespace, session_timeout_ms=6000,
                    relay=False)  # the test's own relay, which it can stop and replace
    relay = relay or Relay(bootstrap, namespace, None, AUTHORITIES, name="r1")
    await worker.start()
    if not relay_later:  # (else the test starts it)
        await relay.start()
    try:
        yield relay
    finally:
        await relay.stop()
        await worker.stop()


async def journal_records(bootstrap: str, namespace: str) -> list[tuple[int, int, Any]]:
    found = []
    async for raw in read_partitions(bootstrap, f"{namespace}.journal"):
        found.append((raw.partition, raw.offset, decode(raw.value, raw.headers)))
    return found


async def dead_letters(bootstrap: str, namespace: str, count: int,
                       timeout: float = 30) -> list[tuple[str, str]]:
    """(key, reason) of the first `count` dead letters, waiting for them."""
    deadline = time.monotonic() + timeout
    while True:
        found = []
        try:
            async for raw in read_partitions(bootstrap, dead_letter_topic(namespace)):
                headers = dict(raw.headers)
                found.append((headers["runstream-dead-letter-source"].decode(),
                              headers[REASON_HEADER].decode()))
        except TimeoutError:
            pass
        if len(found) >= count or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.3)


async def test_create_signal_cancel_through_the_requests_topic(
        bootstrap: str, relayed: str, tmp_path: Path) -> None:
    namespace = relayed
    async with engine(bootstrap, namespace, tmp_path / "w") as relay, \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS) as client:
        route = await client.route()
        assert route.relayed and route.topic == requests_topic(namespace)
        done = await client.create_run(three, {}, run_id="t1")
        assert await done.result(timeout=30) == ["s0", "s1", "s2"]
        waiting = await client.create_run(collector, {"count": 2}, run_id="c1")
        await waiting.admitted(timeout=30)
        first = await client.signal("c1", "item", 1, request_id="item-1")
        again = await client.signal("c1", "item", 1, request_id="item-1")  # taken once
        assert again > first
        await client.signal("c1", "item", 2)
        assert await waiting.result(timeout=30) == [1, 2]
        sleeping = await client.create_run(collector, {"count": 1, "sleep": 60}, run_id="z1")
        await sleeping.admitted(timeout=30)
        await client.cancel("z1", reason="no longer needed")
        with pytest.raises(RunCancelled, match="no longer needed"):
            await sleeping.result(timeout=30)
        assert relay.forwarded == 7 and relay.refused == 0
    records = await journal_records(bootstrap, namespace)
    requests = [r for _, _, r in records if r.KIND == "request"]
    assert collections.Counter(r.TYPE for r in requests) == {
        "run.create-requested": 3, "run.signal-sent": 3, "run.cancel-requested": 1}


async def test_forged_decisions_never_reach_the_journal(
        bootstrap: str, relayed: str, tmp_path: Path) -> None:
    namespace = relayed
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        async with engine(bootstrap, namespace, tmp_path / "w"), \
                Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS) as client:
            run = await client.create_run(collector, {"count": 1}, run_id="victim")
            await run.admitted(timeout=30)
            partition = run_partition("victim", TEST_JOURNAL_PARTITIONS)
            now = int(time.time() * 1000)
            forged_claim = ev.PartitionEpochClaimed(
                envelope=Envelope(type=ev.PartitionEpochClaimed.TYPE, run_id="", lineage_id="",
                                  epoch=99, source_id="forger", source_seq=1, timestamp_ms=now),
                partition=partition, epoch=99, owner="forger", generation=10_000)
            forged_step = ev.StepCompleted(
                envelope=Envelope(type=ev.StepCompleted.TYPE, run_id="victim", lineage_id="victim",
                                  epoch=1, source_id="forger", source_seq=2, timestamp_ms=now),
                position=0, name="item", kind="wait", result_json='"forged"')
            topic = requests_topic(namespace)
            for record, key in ((forged_claim, b""), (forged_step, b"victim")):
                value, headers = encode(record)
                await producer.send_and_wait(topic, value=value, key=key, headers=headers,
                                             partition=partition)
            await producer.send_and_wait(topic, value=b"\x00garbage", key=b"victim",
                                         partition=partition)
            letters = await dead_letters(bootstrap, namespace, 3)
            await client.signal("victim", "item", "real")
            assert await run.result(timeout=30) == ["real"]
            normal = await client.create_run(three, {}, run_id="after")
            assert await normal.result(timeout=30) == ["s0", "s1", "s2"]
    finally:
        await producer.stop()
    reasons = dict(letters)
    assert reasons[f"{topic}:{partition}:1"].startswith(
        "not a request: partition.epoch-claimed is a decision")
    assert reasons[f"{topic}:{partition}:2"].startswith("not a request: step.completed")
    assert reasons[f"{topic}:{partition}:3"].startswith("decode error")
    records = await journal_records(bootstrap, namespace)
    assert not [r for _, _, r in records if r.envelope.source_id == "forger"]


async def test_a_restricted_authority_cannot_widen_its_ceiling(
        bootstrap: str, relayed: str, tmp_path: Path) -> None:
    namespace = relayed
    executions.clear()
    async with engine(bootstrap, namespace, tmp_path / "w"), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS,
                   authority_name="team") as team, \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS,
                   authority_name="rogue") as rogue:
        assert (await team.route()).topic == requests_topic(namespace, "team")
        # The flow declares email and payments: the relay narrows the run to email.
        run = await team.create_run(mailer, None, run_id="m1")
        with pytest.raises(RunFailed, match="payments"):
            await run.result(timeout=30)
        assert (await team.describe("m1")).ceiling == ("email",)
        assert executions == {"m1/mail": 1}
        # An authority no worker configured gets nothing relayed.
        await rogue.create_run(three, {}, run_id="r1")
        [(source, reason)] = await dead_letters(bootstrap, namespace, 1)
    assert source.startswith(requests_topic(namespace, "rogue"))
    assert "authority 'rogue' is not configured" in reason
    records = await journal_records(bootstrap, namespace)
    assert not [r for _, _, r in records if r.envelope.run_id == "r1"]


async def test_a_relay_killed_before_committing_forwards_again_without_effect(
        bootstrap: str, relayed: str, tmp_path: Path) -> None:
    namespace = relayed
    executions.clear()
    crashing = Relay(bootstrap, namespace, None, AUTHORITIES, name="crashing")
    async with engine(bootstrap, namespace, tmp_path / "w", crashing), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS) as client:
        consumer = crashing._consumer
        assert consumer is not None

        async def never(*args: object, **kwargs: object) -> None:
            return None  # the relay dies between forwarding and committing, every time

        consumer.commit = never  # type: ignore[method-assign]
        runs = [await client.create_run(three, {}, run_id=f"k{i}") for i in range(3)]
        waiting = await client.create_run(collector, {"count": 2}, run_id="kc")
        await waiting.admitted(timeout=30)
        for item in ("a", "b"):
            await client.signal("kc", "item", item)
        assert [await r.result(timeout=30) for r in runs] == [["s0", "s1", "s2"]] * 3
        assert await waiting.result(timeout=30) == ["a", "b"]
        await crashing.stop()
        # The next relay starts from the group's committed offsets: none, so everything.
        second = Relay(bootstrap, namespace, None, AUTHORITIES, name="second")
        await second.start()
        try:
            for _ in range(150):  # 30 s at most
                if second.forwarded >= 6:
                    break
                await asyncio.sleep(0.2)
            assert second.forwarded == 6
            # Acknowledged, so in the read model's catch-up: the same reducer as the owner.
            view = await (await client.read_model()).catch_up()
            for run_id in ("k0", "k1", "k2", "kc"):
                verdicts = collections.defaultdict(list)
                for item in view.history(run_id):
                    record = decode(item.raw)
                    if record.KIND == "request":
                        verdicts[record.envelope.request_id].append(item.verdict.value)
                assert set(map(tuple, verdicts.values())) == {("applied", "duplicate")}
            assert len(verdicts) == 3  # kc: its create and two signals
        finally:
            await second.stop()
    records = await journal_records(bootstrap, namespace)
    ids = collections.Counter(r.envelope.request_id for _, _, r in records
                              if r.KIND == "request")
    assert sorted(ids.values()) == [2] * 6  # every request is in the journal twice
    assert executions == {f"k{i}/s{j}": 1 for i in range(3) for j in range(3)}
    created = [r for _, _, r in records if isinstance(r, ev.RunCreated) and not r.duplicate]
    assert len(created) == 4
    result = json.loads(next(r.result_json for _, _, r in records
                             if isinstance(r, ev.RunCompleted) and r.envelope.run_id == "kc"))
    assert result == ["a", "b"]


async def test_a_record_too_large_to_copy_whole_is_set_aside_and_the_relay_goes_on(
        bootstrap: str, relayed: str, tmp_path: Path) -> None:
    """A record the requests topic takes but the dead letters' copy cannot hold whole (its
    value and the copy's headers over the producer's 1 MiB): the copy leaves the value out
    and says its size. Before, the producer refused the copy and the relay read the same
    record again and again: no request after it on that partition was relayed."""
    from runstream.engine.ops.deadletters import row_of
    namespace = relayed
    partition = run_partition("after-big", TEST_JOURNAL_PARTITIONS)
    topic = requests_topic(namespace)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=2 * 1024 * 1024)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value=b"\x00" * 1_048_400, key=b"after-big",
                                     partition=partition)
        create = ev.RunCreateRequested(
            envelope=Envelope(type=ev.RunCreateRequested.TYPE, run_id="heavy",
                              lineage_id="heavy", request_id="heavy-1",
                              timestamp_ms=int(time.time() * 1000)),
            flow="three", payload_json="{}")
        value, headers = encode(create)
        await producer.send_and_wait(  # (a request's headers are 16 KiB at most)
            topic, value=value, key=b"heavy", headers=[*headers, ("trace", b"t" * 20_000)],
            partition=run_partition("heavy", TEST_JOURNAL_PARTITIONS))
    finally:
        await producer.stop()
    async with engine(bootstrap, namespace, tmp_path / "w") as relay, \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS) as client:
        after = await client.create_run(three, {}, run_id="after-big")
        assert await after.result(timeout=60) == ["s0", "s1", "s2"]
        assert relay.refused == 2
    letters = [raw async for raw in read_partitions(bootstrap, dead_letter_topic(namespace))]
    rows = sorted((row.reason, row.size, raw.value is None)
                  for raw in letters if (row := row_of(raw)) is not None)
    assert rows == sorted([("not a request", 1_048_400, True),
                           ("not a request", len(value), True)])


async def test_a_create_the_relay_refuses_ends_its_handle_s_waits(
        bootstrap: str, relayed: str, tmp_path: Path) -> None:
    # (the handle waited for an admission that never came, and every relayed create left
    # its request id in the tail's watch list for good)
    namespace = relayed
    async with engine(bootstrap, namespace, tmp_path / "w"), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS,
                   authority_name="rogue", relay_timeout=3) as rogue, \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS) as client:
        refused = await rogue.create_run(three, {}, run_id="r-refused")
        started = time.monotonic()
        with pytest.raises(RequestNotRelayed):
            await refused.result(timeout=30)
        assert time.monotonic() - started < 15
        done = await client.create_run(three, {}, run_id="r-done")
        assert await done.result(timeout=30) == ["s0", "s1", "s2"]
        assert not client._tail._expected and not rogue._tail._expected


async def test_a_request_the_relay_refuses_is_refused_at_once_in_the_relay_s_words(
        bootstrap: str, relayed: str, tmp_path: Path) -> None:
    # (a client waited its whole relay timeout, a minute by default, for a request the relay
    # had refused in milliseconds, then asked "is a worker up?"; `run create` printed the
    # tail's end as the create's offset)
    namespace = relayed
    async with engine(bootstrap, namespace, tmp_path / "w"), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS,
                   authority_name="rogue") as rogue:
        started = time.monotonic()
        refused = await rogue.create_run(three, {}, run_id="r-at-once")
        # two waits on the one request: both told (the second's look took the first's place,
        # which then waited its whole timeout)
        both = await asyncio.gather(refused.admitted(timeout=60), refused.result(timeout=60),
                                    return_exceptions=True)
        assert all(isinstance(answer, RequestNotRelayed) for answer in both), both
        assert time.monotonic() - started < 20
        with pytest.raises(RequestNotRelayed, match="refused it: authority 'rogue' is not "
                                                    "configured"):
            await refused.result(timeout=60)
        assert refused.journal_offset is None
        with pytest.raises(RequestNotRelayed, match="not configured"):
            await rogue.signal("r-at-once", "item", 1)
        assert time.monotonic() - started < 20
        assert not rogue._tail._expected
        started = time.monotonic()
        result = await cli("run", "create", three.name, "--authority-name", "rogue",
                           "--json", bootstrap=bootstrap, namespace=namespace)
        assert time.monotonic() - started < 30
    assert result.code != 0 and not result.out
    assert "the relay refused it: authority 'rogue' is not configured" in one_line_error(result)


async def test_a_refusal_of_an_earlier_send_is_not_taken_for_a_later_one_s(
        bootstrap: str, relayed: str, tmp_path: Path) -> None:
    # (a copy was matched by its request id: the same id sent again, once the authority was
    # configured but before a relay ran, was said refused, and the relay then forwarded it;
    # not forwarded in time, the error says it stays and will be)
    namespace = relayed
    first = Relay(bootstrap, namespace, None, {}, name="r-none")  # (rogue: not configured)
    await first.start()
    async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS,
                      authority_name="rogue", relay_timeout=4) as rogue:
        try:
            with pytest.raises(RequestNotRelayed, match="refused it"):
                await rogue.signal("r-stale", "item", 1, request_id="same")
        finally:
            await first.stop()
        with pytest.raises(RequestNotRelayed, match=r"It stays in \S+ and is forwarded when "
                                                    r"one is: send it again only under its "
                                                    r"request id 'same'"):
            await rogue.signal("r-stale", "item", 1, request_id="same")
    later = Relay(bootstrap, namespace, None, {"rogue": frozenset()}, name="r-rogue")
    await later.start()
    try:
        async def forwarded() -> bool:
            return any(r.envelope.run_id == "r-stale"
                       for _, _, r in await journal_records(bootstrap, namespace))
        await until(forwarded, "the second send, forwarded", timeout=30)
    finally:
        await later.stop()


async def test_a_relayed_create_whose_first_wait_was_cut_short_is_answered_later(
        bootstrap: str, relayed: str, tmp_path: Path) -> None:
    """A relayed create's handle knows, until the relay's offset is found, only where the
    tail stood when it was sent; a wait cut short then (no relay up) leaves it that. The
    next wait, once a worker is back, finds its answer from there, reading what landed
    first (here the new owner's claim), which the tail stepped over as if it were the
    create (54a6f70): its fold fell an epoch behind, and the result never came."""
    namespace = relayed
    ids = [f"cut-{i}" for i in range(1000)]
    first, waited, later = [i for i in ids if run_partition(i, TEST_JOURNAL_PARTITIONS)
                            == run_partition(ids[0], TEST_JOURNAL_PARTITIONS)][:3]
    async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS) as client:
        async with engine(bootstrap, namespace, tmp_path / "w1"):
            done = await client.create_run(three, {}, run_id=first)
            assert await done.result(timeout=30) == ["s0", "s1", "s2"]  # (the tail follows)
        handles = []
        for run_id, seconds in ((waited, 3), (later, 0.5)):  # (the first wait reads to the
            handles.append(await client.create_run(three, {}, run_id=run_id))  # partition's
            with pytest.raises(ResultTimeout):  # end: the next is sent there)
                await handles[-1].admitted(timeout=seconds)
        partition = run_partition(later, TEST_JOURNAL_PARTITIONS)
        epoch = (await (await client.read_model()).catch_up([partition])).partition(
            partition).epoch
        relay = Relay(bootstrap, namespace, None, AUTHORITIES, name="r2")
        relay_started = False

        async def claimed_then_relayed() -> bool:  # (the claim lands first, then the creates)
            nonlocal relay_started
            view = await (await client.read_model()).catch_up([partition])
            if view.partition(partition).epoch > epoch and not relay_started:
                await relay.start()
                relay_started = True
            return relay_started

        async with engine(bootstrap, namespace, tmp_path / "w2", relay=relay, relay_later=True):
            await until(claimed_then_relayed, "the new owner's claim", timeout=30)
            for handle in reversed(handles):  # (the later first: the tail stands at its offset)
                assert await handle.result(timeout=30) == ["s0", "s1", "s2"]
            view = await (await client.read_model()).catch_up([partition])
            tail = client._tail._tails[partition].state
            assert (tail.epoch, tail.owner_name) == (view.partition(partition).epoch,
                                                     view.partition(partition).owner_name)


async def test_a_refused_create_whose_first_wait_was_cut_short_still_ends_its_waits(
        bootstrap: str, relayed: str, tmp_path: Path) -> None:
    # (where the relay put it was looked up once: cut short by a timeout, every later wait
    # waited from where the tail stood when it was sent, for ever, for a create the relay
    # had refused)
    namespace = relayed
    async with engine(bootstrap, namespace, tmp_path / "w"), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS,
                   authority_name="rogue", relay_timeout=3) as rogue:
        refused = await rogue.create_run(three, {}, run_id="r-cut-refused")
        with pytest.raises(ResultTimeout):
            await refused.admitted(timeout=0.5)
        started = time.monotonic()
        with pytest.raises(RequestNotRelayed):
            await refused.result(timeout=20)
        assert time.monotonic() - started < 15
        assert not rogue._tail._expected


async def test_a_create_not_relayed_in_time_is_found_once_relayed_later(
        bootstrap: str, relayed: str, tmp_path: Path) -> None:
    # (after RequestNotRelayed the tail no longer watched for the request: the next lookup
    # missed it once relayed, and said RequestNotRelayed again)
    namespace = relayed
    async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS,
                      relay_timeout=5) as client:
        late = await client.create_run(three, {}, run_id="r-relayed-late")
        with pytest.raises(RequestNotRelayed):  # (no relay up yet)
            await late.admitted(timeout=30)
        async with engine(bootstrap, namespace, tmp_path / "w"):
            assert await late.result(timeout=30) == ["s0", "s1", "s2"]


async def test_a_refusal_quoting_long_client_text_and_a_create_of_a_round_id_are_set_aside(
        bootstrap: str, relayed: str, tmp_path: Path) -> None:
    """A fork request whose source id is 600,000 characters: its refusal's reason quoted it
    whole, the dead letter's copy passed the producer's 1 MiB, and the relay read it again
    and again (every later request of its partition waited). A create naming `x~1`, a round
    of lineage x: forwarded, it made a run that x's first handoff took over, and that round
    never ran."""
    from runstream.engine.ops.deadletters import row_of
    from tests.integration.test_lifetime import plain_request
    namespace = relayed
    topic = requests_topic(namespace)
    fork = plain_request("run.fork-requested", "src", source_run_id="s" * 600_000,
                         source_offset=0, target_run_id="copy-1")
    round_id = plain_request("run.create-requested", "x~1", lineage_id="x", flow="three",
                             payload_json="{}")
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=2 * 1024 * 1024)
    await producer.start()
    try:
        for run_id, key, value in (("src", b"src", fork), ("x~1", b"x", round_id)):
            await producer.send_and_wait(topic, value=value, key=key, partition=run_partition(
                run_id, TEST_JOURNAL_PARTITIONS))
    finally:
        await producer.stop()
    async with engine(bootstrap, namespace, tmp_path / "w") as relay, \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS) as client:
        for run_id in ("src", "x"):  # (after each refused request, on its partition)
            later = await client.create_run(three, {}, run_id=run_id)
            assert await later.result(timeout=60) == ["s0", "s1", "s2"]
        assert relay.refused == 2
    letters = [raw async for raw in read_partitions(bootstrap, dead_letter_topic(namespace))]
    said = [f"{row.reason}: {row.detail}" for raw in letters if (row := row_of(raw)) is not None]
    assert len(said) == 2 and all(len(text) < 2100 for text in said), [len(t) for t in said]
    assert any("names a round of lineage 'x'" in text for text in said), said


# A producer writing a record whose header key is not UTF-8, as any client may (the Java
# client reads such a key with replacement characters; aiokafka's reader raises): aiokafka's
# pure-Python encoder, given a str whose encode() returns the bytes.
BAD_HEADER_PRODUCER = """
import asyncio, sys
from aiokafka import AIOKafkaProducer

class Key(str):
    def encode(self, *args, **kwargs):
        return b"\\xff\\xfe-bad"

async def main(bootstrap, topic, partition):
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"junk", key=b"odd", partition=int(partition),
                                     headers=[(Key("rs-type"), b"run.create-requested")])
    finally:
        await producer.stop()

asyncio.run(main(*sys.argv[1:4]))
"""


async def test_a_record_whose_header_key_is_not_utf8_is_set_aside_and_the_relay_goes_on(
        bootstrap: str, relayed: str, tmp_path: Path) -> None:
    """aiokafka cannot read such a record: its poll raised UnicodeDecodeError, which ended
    the relay (no log line), and every later request of the namespace waited; a new relay
    died on it again."""
    import os
    import sys

    from runstream.engine.ops.deadletters import row_of
    namespace = relayed
    partition = run_partition("after-odd", TEST_JOURNAL_PARTITIONS)
    before = await asyncio.create_subprocess_exec(
        sys.executable, "-c", BAD_HEADER_PRODUCER, bootstrap, requests_topic(namespace),
        str(partition), env={**os.environ, "AIOKAFKA_NO_EXTENSIONS": "1"})
    assert await before.wait() == 0
    async with engine(bootstrap, namespace, tmp_path / "w") as relay, \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS) as client:
        after = await client.create_run(three, {}, run_id="after-odd")
        assert await after.result(timeout=60) == ["s0", "s1", "s2"]
        assert relay.refused == 1 and relay._task is not None and not relay._task.done()
    letters = [raw async for raw in read_partitions(bootstrap, dead_letter_topic(namespace))]
    rows = [row for raw in letters if (row := row_of(raw)) is not None]
    assert [(row.reason, row.partition, row.offset) for row in rows] == [
        ("unreadable", partition, 0)]
