"""A large journal without running the engine: real encoded records, as an owner writes them.

Per partition: one `partition.epoch-claimed` from the generator's source id, then for each
run `run.create-requested` (a request), `run.created`, `run.activated`, three
`step.completed` and `run.completed` (or `run.failed` for a share of runs), every decision
under epoch 1 with the source's sequence strictly increasing per partition. Keys are run ids
and partitions follow Kafka's default partitioner, so the engine's readers find them where
they would find real runs.

With `attributes` (RunAttributes), still seven records a run: each create request carries
`attributes_json` (customer, region, amount, due: a pure function of the run's number, so a
bench knows every answer without keeping them), the third step is a `ctx.set_attributes`
entry (`step.completed` of kind `attributes`, setting `stage`), and a share of runs ends
suspended on a signal wait (`run.suspended`, reason event) instead of settling.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaProducer

from runstream.engine.journal import Envelope, JournalRecord, encode
from runstream.engine.journal import events as ev
from runstream.engine.journal.timetext import iso_time
from runstream.engine.kafka.connection import kafka_options
from runstream.projections.partitioning import partition_for

RECORDS_PER_RUN = 7
STEPS = ("reserve", "charge", "receipt")
EPOCH = 1
_BATCH_BYTES = 256 * 1024
_MAX_BATCHES_IN_FLIGHT = 32
_MASK = (1 << 64) - 1


def run_id_of(i: int) -> str:
    return f"run-{i:07d}"


def _mixed(i: int) -> int:
    """splitmix64's finalizer of `i`: 64 well-spread bits, the same on every call."""
    z = ((i + 0x9E3779B97F4A7C15) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


@dataclass(frozen=True)
class RunAttributes:
    """What a generated run is about, from its number alone (no state: a bench recomputes
    any answer by walking the numbers): `customer` one of `customers` ids "c-00000"..,
    `region` one of `regions`, `amount` a float 0.00-999.99, `due` a time up to `due_days`
    after the run's creation; then `stage` set by the handler (`ctx.set_attributes`).
    Every `suspended_every`-th run (but the failed ones) ends suspended."""

    customers: int = 10_000
    regions: tuple[str, ...] = ("eu", "us", "apac", "latam")
    due_days: int = 30
    suspended_every: int = 3

    def customer(self, i: int) -> str:
        return f"c-{_mixed(i) % self.customers:05d}"

    def region(self, i: int) -> str:
        return self.regions[(_mixed(i) >> 20) % len(self.regions)]

    def amount(self, i: int) -> float:
        return ((_mixed(i) >> 32) % 100_000) / 100

    def due_ms(self, i: int, created_ms: int) -> int:
        return created_ms + ((_mixed(i) >> 40) % (self.due_days * 86_400)) * 1000

    def create_json(self, i: int, created_ms: int) -> str:
        """The create request's attributes_json."""
        return json.dumps({"customer": self.customer(i), "region": self.region(i),
                           "amount": self.amount(i),
                           "due": {"$time": iso_time(self.due_ms(i, created_ms))}},
                          separators=(",", ":"))


def outcome_of(i: int, failed_every: int, attributes: RunAttributes | None) -> str:
    """How generated run number `i` ends: failed, suspended or completed."""
    if i % failed_every == failed_every - 1:
        return "failed"
    if attributes is not None and attributes.suspended_every and (
            i % attributes.suspended_every == 0):
        return "suspended"
    return "completed"


@dataclass
class GeneratedJournal:
    topic: str
    partitions: int
    records: int = 0
    run_ids: list[str] = field(default_factory=list)
    failed: set[str] = field(default_factory=set)
    seconds: float = 0.0
    suspended: set[str] = field(default_factory=set)
    attributes: RunAttributes | None = None
    failed_every: int = 20


@dataclass
class _Partition:
    """Where the generator stands in one partition: next offset and source sequence."""

    number: int
    next_offset: int = 0
    seq: int = 0


class _Writer:
    def __init__(self, partitions: int) -> None:
        self.source_id = f"bench-gen-{uuid.uuid4().hex[:8]}"
        self.parts = [_Partition(p) for p in range(partitions)]
        self.clock = int(time.time() * 1000)

    def _envelope(self, cls: type[Any], part: _Partition, run_id: str, lineage_id: str,
                  request_id: str | None, decision: bool, epoch: int = EPOCH) -> Envelope:
        self.clock += 1
        if not decision:
            return Envelope(type=cls.TYPE, run_id=run_id, lineage_id=lineage_id,
                            request_id=request_id, timestamp_ms=self.clock)
        part.seq += 1
        return Envelope(type=cls.TYPE, run_id=run_id, lineage_id=lineage_id,
                        request_id=request_id, epoch=epoch, source_id=self.source_id,
                        source_seq=part.seq, timestamp_ms=self.clock)

    def claim(self, part: _Partition) -> JournalRecord:
        body: dict[str, Any] = {"partition": part.number, "epoch": EPOCH, "owner": "bench-gen"}
        if "generation" in {f.name for f in dataclasses.fields(ev.PartitionEpochClaimed)}:
            body["generation"] = 1
        envelope = self._envelope(ev.PartitionEpochClaimed, part, "", f"partition/{part.number}",
                                  uuid.uuid4().hex, True, epoch=EPOCH - 1)
        return ev.PartitionEpochClaimed(envelope=envelope, **body)

    def run(self, part: _Partition, run_id: str, outcome: str, number: int = 0,
            attributes: RunAttributes | None = None) -> list[JournalRecord]:
        request_id = uuid.uuid4().hex
        payload = json.dumps({"order_id": run_id, "amount": 1, "work_ms": 0})

        def decide(cls: type[Any], request: str | None = None, **body: Any) -> JournalRecord:
            record: JournalRecord = cls(
                envelope=self._envelope(cls, part, run_id, run_id, request, True), **body)
            return record

        envelope = self._envelope(ev.RunCreateRequested, part, run_id, run_id, request_id,
                                  False)
        request = ev.RunCreateRequested(
            envelope=envelope, flow="checkout", payload_json=payload,
            attributes_json="" if attributes is None
            else attributes.create_json(number, envelope.timestamp_ms))
        records: list[JournalRecord] = [
            request,
            decide(ev.RunCreated, request_id, flow="checkout", payload_json=payload,
                   request_offset=part.next_offset),
            decide(ev.RunActivated, mode="new", activation=1),
        ]
        for position, name in enumerate(STEPS):
            if attributes is not None and position == len(STEPS) - 1:
                # ctx.set_attributes({"stage": ...}): a journaled value of kind attributes
                stage = "awaiting-approval" if outcome == "suspended" else "charged"
                records.append(decide(ev.StepCompleted, position=position, name="attributes",
                                      kind="attributes",
                                      result_json=json.dumps({"stage": stage})))
                continue
            records.append(decide(ev.StepCompleted, position=position, name=name,
                                  result_json=json.dumps(f"{name}-{run_id}")))
        if outcome == "failed":
            records.append(decide(ev.RunFailed, error_type="CardDeclined",
                                  error_message=f"card declined for {run_id}"))
        elif outcome == "suspended":
            records.append(decide(ev.RunSuspended, reason="event", event_name="approval",
                                  position=len(STEPS)))
        else:
            records.append(decide(ev.RunCompleted, result_json=json.dumps({"order_id": run_id})))
        return records


def _records(journal: GeneratedJournal, runs: int, failed_every: int,
             writer: _Writer) -> Iterator[tuple[int, str, JournalRecord]]:
    for part in writer.parts:
        yield part.number, "", writer.claim(part)
        part.next_offset += 1
    for i in range(runs):
        run_id = run_id_of(i)
        outcome = outcome_of(i, failed_every, journal.attributes)
        part = writer.parts[partition_for(run_id, journal.partitions)]
        journal.run_ids.append(run_id)
        if outcome == "failed":
            journal.failed.add(run_id)
        elif outcome == "suspended":
            journal.suspended.add(run_id)
        for record in writer.run(part, run_id, outcome, i, journal.attributes):
            yield part.number, run_id, record
            part.next_offset += 1


async def generate(bootstrap: str, topic: str, partitions: int, records: int,
                   failed_share: float = 0.05, attributes: RunAttributes | None = None
                   ) -> GeneratedJournal:
    """Produce about `records` records (whole runs) into a fresh, empty `topic`; with
    `attributes`, runs with attributes and a share of suspended ones (the module doc)."""
    journal = GeneratedJournal(topic, partitions, attributes=attributes,
                               failed_every=round(1 / failed_share))
    runs = max(1, (records - partitions) // RECORDS_PER_RUN)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                enable_idempotence=True, max_batch_size=_BATCH_BYTES,
                                client_id="runstream-bench-gen", **kafka_options())
    await producer.start()
    started = time.perf_counter()
    try:
        await _produce(producer, journal, runs)
    finally:
        await producer.stop()
    journal.seconds = time.perf_counter() - started
    return journal


async def _produce(producer: AIOKafkaProducer, journal: GeneratedJournal, runs: int) -> None:
    """Whole record batches per partition: far cheaper than one send() per record."""
    builders: dict[int, Any] = {}
    sent: list[asyncio.Future[Any]] = []
    writer = _Writer(journal.partitions)
    for partition, key, record in _records(journal, runs, journal.failed_every, writer):
        value, headers = encode(record)
        builder = builders.get(partition) or producer.create_batch()
        builders[partition] = builder
        if builder.append(key=key.encode() or None, value=value, timestamp=None,
                          headers=headers) is None:
            sent.append(await producer.send_batch(builder, journal.topic, partition=partition))
            builder = builders[partition] = producer.create_batch()
            builder.append(key=key.encode() or None, value=value, timestamp=None, headers=headers)
        journal.records += 1
        if len(sent) >= _MAX_BATCHES_IN_FLIGHT:
            await asyncio.gather(*sent)
            sent = []
    for partition, builder in builders.items():
        sent.append(await producer.send_batch(builder, journal.topic, partition=partition))
    await asyncio.gather(*sent)
