"""`python -m tests.chaos --runs 50000 --duration 20m --seed N`: the long chaos session.

Exit status 0 when the checker found no violation, 1 otherwise. See tests/chaos/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import re
import sys
import tempfile
from pathlib import Path

from tests.chaos.harness import ChaosConfig, run_session


def parse_duration(text: str) -> float:
    """`90`, `90s`, `20m`, `1h` -> seconds."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if found is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (try 90s, 20m, 1h)")
    scale = {"": 1, "s": 1, "m": 60, "h": 3600}[found.group(2)]
    return float(found.group(1)) * scale


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--runs", type=int, default=50_000)
    parser.add_argument("--duration", type=parse_duration, default=1200.0,
                        help="the fault window, e.g. 20m; runs then get --settle to finish")
    parser.add_argument("--seed", type=int, default=None,
                        help="replays a schedule (default: a random seed, printed)")
    parser.add_argument("--faults-per-kind", type=int, default=10)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--session-timeout-ms", type=int, default=6000)
    parser.add_argument("--settle", type=parse_duration, default=600.0)
    parser.add_argument("--max-unfinished", type=int, default=2000,
                        help="at most this many runs created and not finished; no run is "
                        "created after the window (0: create all --runs regardless)")
    parser.add_argument("--dir", type=Path, default=None,
                        help="keep broker data, worker dirs, ledger and logs here")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    # The driver's own client sees every broker restart: aiokafka logs each refused
    # connection; the harness prints what matters.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    root = args.dir or Path(tempfile.mkdtemp(prefix=f"runstream-chaos-{seed}-"))
    config = ChaosConfig(runs=args.runs, fault_window_s=args.duration,
                         per_kind=args.faults_per_kind, seed=seed, root=root,
                         workers=args.workers, partitions=args.partitions,
                         session_timeout_ms=args.session_timeout_ms, settle_s=args.settle,
                         max_unfinished=args.max_unfinished or None)
    print(f"chaos session in {root}", flush=True)
    result = asyncio.run(run_session(config, say=lambda line: print(line, flush=True)))
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
