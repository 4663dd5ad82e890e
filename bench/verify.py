"""`projection verify` against raw consume + decode of the same journal, with checkpoints.

The journal is generated (bench/journal.py). A read model folds it, recording a RocksDB
checkpoint every --verify-checkpoint-every records; a worker-style store (no record bytes,
hash manifests only) is folded from it too. `engine.ops.verify.verify` then rebuilds each from
offset 0 and checks every checkpoint and every key. Limit: one aiokafka consumer reading the
same records and decoding each (target: verify at 0.5 of it or more). Also measured: the
running hash's cost per record, and the time to create one checkpoint of the full store.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from bench.env import Context, fresh_namespace, pick
from bench.journal import GeneratedJournal, _Writer, generate
from bench.journal import _records as sample_records
from bench.raw import consume_and_decode
from bench.report import Row, Section
from bench.system import measure_cpu
from runstream.engine.config import journal_topic
from runstream.engine.ops import verify as integrity
from runstream.engine.ops.rebuild import rebuild_into
from runstream.engine.readmodel.model import ReadModel
from runstream.projections.manifest import CheckpointPolicy
from runstream.projections.memory import MemoryStore
from runstream.projections.partitioning import Placement
from runstream.projections.projector import Projector
from runstream.projections.store import ProjectionStore
from runstream.projections.values import RecordWrite
from runstream.projections.writes import EMPTY_HASH, chain, put_record

CHECKPOINT_SAMPLES = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("verify")
    group.add_argument("--verify-records", type=int, help="journal size [200000; quick 3000]")
    group.add_argument("--verify-partitions", type=int, help="journal partitions [12]")
    group.add_argument("--verify-checkpoint-every", type=int,
                       help="records between checkpoints [20000; quick 500]")
    group.add_argument("--verify-shards", type=int,
                       help="fold processes [one per core; quick: the automatic choice]")


async def run(ctx: Context, args: argparse.Namespace) -> Section:
    section = Section("verify")
    partitions = pick(args, "verify_partitions", 12, 12)
    wanted = pick(args, "verify_records", 200_000, 3_000)
    every = pick(args, "verify_checkpoint_every", 20_000, 500)
    shards = getattr(args, "verify_shards", None)
    scratch = Path(tempfile.mkdtemp(prefix="runstream-bench-verify-"))
    try:
        async with fresh_namespace(ctx, "verify", partitions) as namespace:
            topic = journal_topic(namespace)
            journal = await generate(ctx.bootstrap, topic, partitions, wanted)
            runs = len(journal.run_ids)
            with measure_cpu("raw consume + decode", ctx.pids(), section.cpu, runs):
                raw_records, raw_s = await consume_and_decode(ctx.bootstrap, topic)
            model_path = scratch / "readmodel"
            started = time.perf_counter()
            async with ReadModel(bootstrap=ctx.bootstrap, topic=topic, path=model_path,
                                 checkpoint_every=every, checkpoint_keep=1000) as model:
                await model.catch_up()
            catch_up_s = time.perf_counter() - started
            await rebuild_into(scratch / "worker" / "projection", bootstrap=ctx.bootstrap,
                               topic=topic, checkpoints=CheckpointPolicy(every=every, keep=1000))
            reports = {}
            stores = {"read model": (None, model_path), "worker": (scratch / "worker", None)}
            for kind, (data_dir, model_dir) in stores.items():
                with measure_cpu(f"verify {kind}", ctx.pids(), section.cpu, runs):
                    reports[kind] = await integrity.verify(
                        bootstrap=ctx.bootstrap, namespace=namespace, shards=shards,
                        data_dir=data_dir, read_model_dir=model_dir)
            checkpoint_ms = _checkpoint_ms(model_path)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    raw_rate = raw_records / raw_s
    for kind, report in reports.items():
        if not report.ok or report.records != raw_records:
            raise RuntimeError(f"verify of the {kind} failed or read {report.records} records "
                               f"of {raw_records}: {report.as_dict()}")
        section.add(Row(f"verify {kind}", report.records_per_s, "records/s", limit=raw_rate,
                        limit_name="raw consume + decode",
                        note=f"{report.checkpoints_checked} checkpoints, {report.shards} "
                        f"process(es), {report.keys_compared:,} keys, {report.seconds:.1f} s"))
    section.add(
        Row("raw consume + decode", raw_rate, "records/s",
            note=f"{raw_records:,} records in {raw_s:.1f} s"),
        Row("read model catch-up with checkpoints", raw_records / catch_up_s, "records/s",
            limit=raw_rate, limit_name="raw consume + decode",
            note=f"a checkpoint every {every:,} records"),
        Row("create one checkpoint (full store)", checkpoint_ms, "ms",
            note=f"median of {CHECKPOINT_SAMPLES}, with its RocksDB directory"),
        Row("running hash per record", hash_us_per_record(), "us",
            note="blake2b-128 over the record's stored state bytes"),
    )
    section.info = {"records": raw_records, "runs": runs, "partitions": partitions,
                    "checkpoint_every": every, "generated_in_s": journal.seconds,
                    "verify": {kind: r.as_dict() for kind, r in reports.items()}}
    return section


def _checkpoint_ms(model_path: Path) -> float:
    """Median milliseconds of creating a checkpoint (manifest entry and directory) of the
    folded read model, taken as the read model takes them."""
    store = ProjectionStore(model_path, keep_records=True, checkpoints=CheckpointPolicy(
        every=0, keep=1000, directories=True))
    try:
        times = []
        for _ in range(CHECKPOINT_SAMPLES):
            started = time.perf_counter()
            store.checkpoint()
            times.append((time.perf_counter() - started) * 1000)
    finally:
        store.close()
    return sorted(times)[len(times) // 2]


class _NullBatch:
    """A batch that drops what it is given: put_record only encodes, for the hash's input."""

    def put(self, key: bytes, value: bytes) -> None: ...
    def fresh(self, key: bytes, value: bytes) -> None: ...
    def blind(self, key: bytes, value: bytes) -> None: ...
    def delete(self, key: bytes) -> None: ...
    def delete_range(self, begin: bytes, end: bytes) -> None: ...


class _Capturing(MemoryStore):
    """A MemoryStore that also keeps each RecordWrite (bounded by the sample's records)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[RecordWrite] = []

    def write(self, change: RecordWrite) -> None:
        super().write(change)
        self.writes.append(change)


def hash_us_per_record(runs: int = 2000, passes: int = 5) -> float:
    """Microseconds of writes.chain per record (best of `passes`), over the records of
    `runs` generated runs folded in memory, with the state bytes a store would write."""
    partitions = 4
    journal = GeneratedJournal("sample", partitions)
    store = _Capturing()
    projector = Projector(store)
    offsets = dict.fromkeys(range(partitions), 0)
    for partition, _, record in sample_records(journal, runs, 20, _Writer(partitions)):
        projector.apply_record(partition, offsets[partition], record)
        offsets[partition] += 1
    place = Placement(partitions).place
    inputs = [(change, put_record(_NullBatch(), change, False, place)) for change in store.writes]
    best = float("inf")
    for _ in range(passes):
        started = time.process_time()
        running = EMPTY_HASH
        for change, encoded in inputs:
            running = chain(running, change, encoded)
        best = min(best, time.process_time() - started)
    return best / len(inputs) * 1e6
