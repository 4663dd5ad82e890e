"""The fold (`fold_into` a scratch store, as `projection rebuild` does) against raw consume +
decode of the same journal, in the same run.

The journal is generated (bench/journal.py: whole 3-step checkout runs, real encoded records);
`--fold-topic` folds an existing journal topic instead (left as it is). Raw and the fold are
measured in turn `--fold-repeats` times (raw, fold in place, fold decoded ahead, raw, ...), so
each ratio is of measurements taken next to each other. The fold runs both ways: decoding in
its own process, and with a second process reading and decoding ahead
(engine.kafka.decode_ahead, which `fold_into` uses from RUNSTREAM_DECODE_AHEAD_MIN records
on; forced on here whatever the journal's size). All are timed from their consumer's start
(the fold's store open and close, and the second process's start, are its own); the raw
rate from its first fetch is noted too. `--fold-profile PATH` writes a cProfile of the last
in-place fold (pstats format) for `python -m pstats PATH`.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.env import Context, fresh_namespace, pick
from bench.journal import RECORDS_PER_RUN, generate
from bench.raw import consume_and_decode
from bench.report import Row, Section
from bench.system import measure_cpu
from runstream.engine.config import journal_topic
from runstream.engine.ops.rebuild import FoldSpec, fold_into


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("fold")
    group.add_argument("--fold-runs", type=int, help="runs in the journal [25000; quick 300]")
    group.add_argument("--fold-partitions", type=int, help="journal partitions [6]")
    group.add_argument("--fold-repeats", type=int, help="raw + fold pairs measured [2; quick 1]")
    group.add_argument("--fold-topic", help="fold this existing journal topic, not a new one")
    group.add_argument("--fold-profile", type=Path, help="cProfile of the last fold, to here")


async def run(ctx: Context, args: argparse.Namespace) -> Section:
    section = Section("fold")
    partitions = pick(args, "fold_partitions", 6, 6)
    runs = pick(args, "fold_runs", 25_000, 300)
    topic = getattr(args, "fold_topic", None)  # (absent when bench restore runs this)
    if topic:
        await _measure(ctx, args, section, topic, runs=None)
        return section
    async with fresh_namespace(ctx, "fold", partitions) as namespace:
        topic = journal_topic(namespace)
        journal = await generate(ctx.bootstrap, topic, partitions,
                                 runs * RECORDS_PER_RUN + partitions)
        section.info["generated_in_s"] = round(journal.seconds, 1)
        await _measure(ctx, args, section, topic, runs=len(journal.run_ids))
    section.info["partitions"] = partitions
    return section


async def _measure(ctx: Context, args: argparse.Namespace, section: Section, topic: str,
                   runs: int | None) -> None:
    repeats = pick(args, "fold_repeats", 2, 1)
    ratios: dict[str, list[float]] = {"in place": [], "decoded ahead": []}
    for turn in range(1, repeats + 1):
        with measure_cpu(f"raw consume + decode #{turn}", ctx.pids(), section.cpu,
                         runs or 1):
            # Timed from its consumer's start, as the fold is (its consumer's start, its
            # store's open and close included); the raw rate from the first fetch is noted.
            raw_records, raw_s = await consume_and_decode(ctx.bootstrap, topic,
                                                          with_setup=True)
        _, fetch_s = await consume_and_decode(ctx.bootstrap, topic)
        raw_rate = raw_records / raw_s
        section.add(Row(f"raw consume + decode #{turn}", raw_rate, "records/s",
                        note=f"{raw_records:,} records in {raw_s:.2f} s from the consumer's "
                             f"start; {raw_records / fetch_s:,.0f} records/s from the first "
                             f"fetch"))
        for mode in ratios:
            ahead = mode == "decoded ahead"
            profile = (getattr(args, "fold_profile", None)
                       if turn == repeats and not ahead else None)
            with measure_cpu(f"fold_into {mode} #{turn}", ctx.pids(), section.cpu, runs or 1):
                records, fold_s = await _fold(ctx.bootstrap, topic, profile, ahead)
            if records != raw_records:
                raise RuntimeError(f"the fold applied {records} records, the raw reader "
                                   f"read {raw_records}")
            fold_rate = records / fold_s
            ratios[mode].append(fold_rate / raw_rate)
            section.add(Row(
                f"fold_into {mode} (scratch RocksDB) #{turn}", fold_rate, "records/s",
                limit=raw_rate, limit_name="raw consume + decode, same turn",
                note=f"{records:,} records in {fold_s:.2f} s; "
                     f"{fold_rate * fetch_s / raw_records:.3f} of raw from its first fetch"
                     + ("" if profile is None else " (under cProfile)")))
    section.info.update({"records": records, "runs": runs, "topic": topic,
                         "ratios": {mode: [round(r, 3) for r in values]
                                    for mode, values in ratios.items()}})


async def _fold(bootstrap: str, topic: str, profile: Path | None, ahead: bool
                ) -> tuple[int, float]:
    """(records, seconds) of one `fold_into` a fresh scratch store of the whole topic;
    `ahead`: with a decode-ahead process (forced, whatever the journal's size)."""
    scratch = Path(tempfile.mkdtemp(prefix="runstream-bench-fold-"))
    profiler = cProfile.Profile() if profile is not None else None
    least = os.environ.get("RUNSTREAM_DECODE_AHEAD_MIN")
    os.environ["RUNSTREAM_DECODE_AHEAD_MIN"] = "1"
    try:
        spec = FoldSpec(bootstrap, topic, scratch / "projection", scratch=True,
                        decode_ahead=ahead)
        started = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        result = await fold_into(spec)
        if profiler is not None:
            profiler.disable()
        seconds = time.perf_counter() - started
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if least is None:
            os.environ.pop("RUNSTREAM_DECODE_AHEAD_MIN", None)
        else:
            os.environ["RUNSTREAM_DECODE_AHEAD_MIN"] = least
    if result.decoded_ahead != ahead:
        raise RuntimeError(f"the fold {'did not decode' if ahead else 'decoded'} ahead")
    if profiler is not None and profile is not None:
        profiler.dump_stats(str(profile))
    return result.records, seconds
