"""Timing whole command-line processes: wall time and the CPU they used."""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class ProcessTiming:
    seconds: float
    cpu_ms: float
    returncode: int | None  # None: timed out (and killed)
    output: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def _children_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


def time_process(
    argv: list[str], timeout: float, env: dict[str, str] | None = None
) -> ProcessTiming:
    """Run `argv` to completion; its CPU comes from RUSAGE_CHILDREN around the wait."""
    cpu_before = _children_cpu_ms()
    started = time.perf_counter()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, env=env)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or b""
        text = out.decode(errors="replace") if isinstance(out, bytes) else out
        return ProcessTiming(time.perf_counter() - started, _children_cpu_ms() - cpu_before,
                             None, text)
    seconds = time.perf_counter() - started
    return ProcessTiming(seconds, _children_cpu_ms() - cpu_before, done.returncode,
                         done.stdout + done.stderr)


def python(*args: str) -> list[str]:
    return [sys.executable, *args]
