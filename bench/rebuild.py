"""Folding a journal into a fresh RocksDB projection, against raw consume + decode of it.

The journal is generated (see bench/journal.py); `engine.ops.rebuild.rebuild_into` folds
it from offset 0. Limit: one aiokafka consumer reading the same records and decoding each.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from bench.env import Context, fresh_namespace, pick
from bench.journal import generate
from bench.raw import consume_and_decode
from bench.report import Row, Section
from bench.system import measure_cpu
from runstream.engine.config import journal_topic
from runstream.engine.ops.rebuild import rebuild_into


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("rebuild")
    group.add_argument("--rebuild-records", type=int, help="journal size [200000; quick 2000]")
    group.add_argument("--rebuild-partitions", type=int, help="journal partitions [12]")


async def run(ctx: Context, args: argparse.Namespace) -> Section:
    section = Section("rebuild")
    partitions = pick(args, "rebuild_partitions", 12, 12)
    wanted = pick(args, "rebuild_records", 200_000, 2_000)
    scratch = Path(tempfile.mkdtemp(prefix="runstream-bench-rebuild-"))
    try:
        async with fresh_namespace(ctx, "rebuild", partitions) as namespace:
            topic = journal_topic(namespace)
            journal = await generate(ctx.bootstrap, topic, partitions, wanted)
            runs = len(journal.run_ids)
            with measure_cpu("raw consume + decode", ctx.pids(), section.cpu, runs):
                raw_records, raw_s = await consume_and_decode(ctx.bootstrap, topic)
            with measure_cpu("rebuild_into", ctx.pids(), section.cpu, runs):
                started = time.perf_counter()
                records, _reached = await rebuild_into(scratch / "projection",
                                                       bootstrap=ctx.bootstrap, topic=topic)
                seconds = time.perf_counter() - started
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if records != raw_records:
        raise RuntimeError(f"rebuild folded {records} records, the raw reader read {raw_records}")
    section.add(
        Row("raw consume + decode", raw_records / raw_s, "records/s",
            note=f"{raw_records:,} records in {raw_s:.1f} s"),
        Row("rebuild_into (RocksDB)", records / seconds, "records/s",
            limit=raw_records / raw_s, limit_name="raw consume + decode",
            note=f"{records:,} records, {runs:,} runs, {partitions} partitions"),
        Row("rebuild_into time", seconds, "s", limit=raw_s, limit_name="raw consume + decode"),
    )
    section.info = {"records": records, "runs": runs, "partitions": partitions,
                    "generated_in_s": journal.seconds}
    return section
