"""`python -m bench SUBCOMMAND`: run benchmarks, print their tables, write the results JSON."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from bench import (
    clients,
    codec,
    failover,
    fold,
    latency,
    query,
    rebuild,
    relay,
    restore,
    schedules,
    snapshot_reads,
    throughput,
    timetravel,
    verify,
    waits,
)
from bench.env import Context
from bench.report import Section, format_section, write_results
from bench.system import broker_pid, flush_policy
from runstream.engine.cli.eventloop import loop_name, run_async
from runstream.engine.config import resolve_bootstrap

SECTIONS: dict[str, ModuleType] = {
    "codec": codec,
    "throughput": throughput,
    "latency": latency,
    "rebuild": rebuild,
    "query": query,
    "failover": failover,
    "waits": waits,
    "timetravel": timetravel,
    "verify": verify,
}
# Run by name only, not by `all` (whose --quick form CI runs): what relay mode costs, the
# fold against raw consume + decode, takeover and bootstrap against history (issue 19), and
# the raw limits through librdkafka beside aiokafka's (needs confluent-kafka installed).
EXTRA_SECTIONS: dict[str, ModuleType] = {"relay": relay, "fold": fold, "restore": restore,
                                         "schedules": schedules, "clients": clients,
                                         "snapshot-reads": snapshot_reads}
RESULTS_DIR = Path(__file__).parent / "results"


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--bootstrap", default=None,
                        help="Kafka bootstrap servers [env RUNSTREAM_BOOTSTRAP, 127.0.0.1:9092]")
    common.add_argument("--quick", action="store_true",
                        help="tiny sizes: checks that everything works, says nothing of speed")
    common.add_argument("--results-dir", type=Path, default=RESULTS_DIR,
                        help="where the results JSON goes [bench/results]")
    common.add_argument("--namespace-prefix", default="bench",
                        help="prefix of the fresh namespaces (topics deleted afterwards)")
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    for name, module in {**SECTIONS, **EXTRA_SECTIONS}.items():
        doc = (module.__doc__ or name).strip().splitlines()[0]
        module.add_arguments(commands.add_parser(name, parents=[common], help=doc))
    everything = commands.add_parser("all", parents=[common], help="every benchmark in turn")
    for module in SECTIONS.values():
        module.add_arguments(everything)
    return parser


async def describe_broker(bootstrap: str, needed: bool) -> dict[str, Any]:
    if not needed:
        return {}
    pid = broker_pid(bootstrap)
    return {"pid": pid, **await flush_policy(bootstrap, pid)}


async def run_section(name: str, ctx: Context, args: argparse.Namespace) -> Section:
    started = time.perf_counter()
    try:
        section: Section = await {**SECTIONS, **EXTRA_SECTIONS}[name].run(ctx, args)
    except Exception as exc:
        traceback.print_exc()
        section = Section(name, info={"error": f"{type(exc).__name__}: {exc}"})
    section.seconds = time.perf_counter() - started
    return section


async def main_async(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    names = list(SECTIONS) if args.command == "all" else [args.command]
    bootstrap = resolve_bootstrap(args.bootstrap)
    broker = await describe_broker(bootstrap, names != ["codec"])
    header = (f"broker {bootstrap}: flush {broker.get('flush', 'n/a')}; event loop "
              f"{loop_name()} (bench and workers)" if broker else "")
    ctx = Context(bootstrap=bootstrap, quick=args.quick, prefix=args.namespace_prefix,
                  results_dir=args.results_dir, broker_pid=broker.get("pid"))
    sections = []
    for name in names:
        section = await run_section(name, ctx, args)
        print(format_section(section, header), flush=True)
        if "error" in section.info:
            print(f"  FAILED: {section.info['error']}", flush=True)
        sections.append(section)
    environment = {"command": args.command, "quick": args.quick, "bootstrap": bootstrap,
                   "broker": broker, "event_loop": loop_name(),
                   "total_seconds": round(time.perf_counter() - started, 1)}
    path = write_results(args.results_dir, sections, environment)
    print(f"results: {path} ({time.perf_counter() - started:.0f} s in all)")
    return 1 if any("error" in s.info for s in sections) else 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Read models the clients, workers and CLI keep on disk go to a scratch cache, removed
    # afterwards: nothing of the fresh namespaces is left in ~/.cache/runstream.
    with tempfile.TemporaryDirectory(prefix="runstream-bench-cache-") as cache:
        os.environ["RUNSTREAM_CACHE_DIR"] = cache
        return run_async(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
