"""Journal codec throughput against raw fastavro on the same datum.

For RunCreated and StepCompleted: records per CPU-second for the codec's encode and decode
and for fastavro's schemaless_writer / schemaless_reader on the identical Avro datum (same
parsed schema; no framing, checks or dataclasses). The ratio is the price of framing, field
checks, headers and typed records. Each figure is the best of ten alternating rounds.
"""

from __future__ import annotations

import argparse
import io
import time
from collections.abc import Callable

from fastavro import schemaless_reader, schemaless_writer

from bench.env import Context, pick
from bench.report import Row, Section
from runstream.engine.journal import (
    FRAME_SIZE,
    Codec,
    Envelope,
    JournalRecord,
    RunCreated,
    SchemaRegistry,
    StepCompleted,
    record_to_dict,
)

Operation = Callable[[], object]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("codec")
    group.add_argument("--codec-seconds", type=float,
                       help="CPU seconds per comparison [2.0; quick 0.2]")


def sample_records() -> list[JournalRecord]:
    """Records shaped like the engine's: a decision envelope, short ids, small JSON bodies."""

    def envelope(record_type: str, request_id: str | None = None) -> Envelope:
        lineage = "01J9ZQ4W8X3M5N7P9R1T3V5X7Z"
        return Envelope(type=record_type, run_id=lineage, lineage_id=lineage,
                        request_id=request_id, epoch=7, source_id="worker-3f9a2c",
                        source_seq=120_431, timestamp_ms=1_735_689_600_123)

    return [
        RunCreated(
            envelope=envelope(RunCreated.TYPE, request_id="req-8c1d2e"),
            flow="billing.charge_customer",
            payload_json='{"customer": "cus_42", "amount_cents": 1999, "currency": "EUR"}',
            request_offset=88_213,
        ),
        StepCompleted(
            envelope=envelope(StepCompleted.TYPE),
            position=4,
            name="charge_card",
            result_json='{"charge_id": "ch_3PZ", "status": "succeeded"}',
        ),
    ]


def rates(ours: Operation, raw: Operation, seconds: float) -> tuple[float, float]:
    """Best operations per CPU-second of each, over rounds that alternate between them.

    CPU time (not wall time) and alternation both keep a shared, busy machine from skewing the
    ratio: time spent waiting for a core is not counted, and load that comes and goes lands on
    both sides.
    """
    best = [0.0, 0.0]
    rounds = 10
    for _ in range(rounds):
        for index, operation in enumerate((ours, raw)):
            done = 0
            start = time.process_time()
            deadline = start + seconds / rounds / 2
            while time.process_time() < deadline:
                for _ in range(500):
                    operation()
                done += 500
            best[index] = max(best[index], done / (time.process_time() - start))
    return best[0], best[1]


def compare(codec: Codec, record: JournalRecord, seconds: float) -> list[tuple[str, float, float]]:
    schema = codec.registry.current(record.TYPE).parsed
    datum = record_to_dict(record)
    value, headers = codec.encode(record)
    avro = value[FRAME_SIZE:]

    def raw_write() -> bytes:
        buffer = io.BytesIO()
        schemaless_writer(buffer, schema, datum)
        return buffer.getvalue()

    def raw_read() -> object:
        return schemaless_reader(io.BytesIO(avro), schema, None)

    if raw_write() != avro:
        raise RuntimeError("the codec must write exactly fastavro's bytes")
    if codec.decode(value, headers) != record:
        raise RuntimeError("the codec must decode what it encoded")
    return [
        ("encode", *rates(lambda: codec.encode(record), raw_write, seconds)),
        ("decode", *rates(lambda: codec.decode(value, headers), raw_read, seconds)),
    ]


async def run(ctx: Context, args: argparse.Namespace) -> Section:
    section = Section("codec")
    seconds = pick(args, "codec_seconds", 2.0, 0.2)
    codec = Codec(SchemaRegistry.load())
    for record in sample_records():
        size = len(codec.encode(record)[0])
        name = type(record).__name__
        for op, ours, raw in compare(codec, record, seconds):
            section.add(Row(f"{name} {op}", ours, "records/CPU-s", limit=raw,
                            limit_name="fastavro on the same datum",
                            note=f"{size} bytes framed; CPU {1e6 / ours:.1f} us/record"))
    section.info = {"cpu_seconds_per_comparison": seconds}
    return section
