"""Figures beside their limits: rows, sections, the printed table and the results JSON."""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


@dataclass
class Row:
    """One figure and the physical limit measured for it in the same run.

    `limit` is in the figure's own unit, so `ratio = value / limit` always: for a rate below
    1 means slower than the limit, for a time above 1 means slower than the limit.
    """

    figure: str
    value: float | None
    unit: str
    limit: float | None = None
    limit_name: str = ""
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.value is None or not self.limit:
            return None
        return self.value / self.limit

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio}


@dataclass
class CpuLine:
    """CPU milliseconds per unit of work (usually per run) of every process involved."""

    label: str
    per: str
    units: int
    ms: dict[str, float | None]

    def per_unit(self) -> dict[str, float | None]:
        return {name: (None if ms is None or not self.units else ms / self.units)
                for name, ms in self.ms.items()}

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "per": self.per, "units": self.units,
                "cpu_ms_total": self.ms, "cpu_ms_per_unit": self.per_unit()}


@dataclass
class Section:
    name: str
    rows: list[Row] = field(default_factory=list)
    cpu: list[CpuLine] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def add(self, *rows: Row) -> None:
        self.rows.extend(rows)

    def as_dict(self) -> dict[str, Any]:
        return {"rows": [r.as_dict() for r in self.rows],
                "cpu": [c.as_dict() for c in self.cpu], "info": self.info,
                "seconds": round(self.seconds, 2)}


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks; NaN when empty."""
    if not values:
        return math.nan
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(sorted(values), n=1000, method="inclusive")[
        max(0, min(998, round(q * 10) - 1))]


def _num(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def format_section(section: Section, header: str = "") -> str:
    lines = [f"== {section.name} ({section.seconds:.1f} s){'  ' + header if header else ''}"]
    table = [("figure", "value", "unit", "limit", "ratio", "limit is / note")]
    for row in section.rows:
        ratio = row.ratio
        note = "; ".join(x for x in (row.limit_name, row.note) if x)
        table.append((row.figure, _num(row.value), row.unit, _num(row.limit),
                      "-" if ratio is None else f"{ratio:.3f}", note))
    widths = [max(len(r[i]) for r in table) for i in range(5)]
    for r in table:
        cells = [r[0].ljust(widths[0]), *(r[i].rjust(widths[i]) for i in range(1, 5))]
        lines.append("  " + "  ".join(cells) + "  " + r[5])
    for line in section.cpu:
        procs = ", ".join(f"{name} {_num(ms)}" for name, ms in line.per_unit().items())
        lines.append(f"  CPU ms per {line.per} [{line.label}; n={line.units:,}]: {procs}")
    return "\n".join(lines)


def _git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5, cwd=Path(__file__).parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def write_results(
    results_dir: Path, sections: list[Section], environment: dict[str, Any]
) -> Path:
    """bench/results/<UTC timestamp>.json (another name if that second is taken)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = results_dir / f"{stamp}.json"
    n = 1
    while path.exists():
        path = results_dir / f"{stamp}-{n}.json"
        n += 1
    document = {
        "written_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "git_commit": _git_commit(),
        "python": platform.python_version(),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        **environment,
        "sections": {s.name: s.as_dict() for s in sections},
    }
    path.write_text(json.dumps(document, indent=2, default=str) + "\n", "utf-8")
    return path

