"""Batch operations (cancel, signal or resume every run a query matches) as runs of the
built-in flow `runstream.batch`, which every worker registers (engine.worker.batch): what
its payload says, the ids it uses, and its progress read from its journal. Pure.

A batch's journal, in order:
  `ends`      the journal's end offsets when it started (and that instant): runs created at
              or after them are not matched, so a batch acts on what existed when it began;
  `match-<k>` the k-th chunk of matching run ids (at most CHUNK), in (partition, run id)
              order, from a read model caught up at least to `ends`;
  `send-<k>`  that chunk's requests, sent with ids `batch/<batch id>/<run id>` (so a re-send
              after a crash is a duplicate), and what each run answered.
A dry run journals only `ends` and the matches. A second batch with the same id is the same
run (its create request names it again): it attaches instead of matching again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from runstream.engine.errors import RunstreamError
from runstream.engine.journal.input_limits import NameInvalid, check_name
from runstream.projections.state import JournalEntry

BATCH_FLOW = "runstream.batch"
OPERATIONS = ("cancel", "signal", "resume")
CHUNK = 500
# A batch matches at most this many runs (its journal holds MAX_RUNS / CHUNK chunk pairs).
MAX_RUNS = 1_000_000
# A batch's result names at most this many refused runs (it counts them all).
MAX_REFUSALS_SHOWN = 100
DRY_RUN_SHOWN = 20
_BATCH_ID = re.compile(r"[A-Za-z0-9_.:-]{1,100}")
_FIELD_TYPES: dict[str, type] = {"batch_id": str, "operation": str, "where": str, "reason": str,
                                 "signal_payload_json": str, "dry_run": bool}
_KIND_NAMES = {str: "text", bool: "true or false"}


class BatchInvalid(RunstreamError, ValueError):
    """A batch the engine cannot run (a bad operation, batch id or query)."""


def batch_run_id(batch_id: str, *, dry_run: bool = False) -> str:
    """The run of batch `batch_id` (a dry run's is its own: it never blocks the real one)."""
    if _BATCH_ID.fullmatch(batch_id) is None:
        raise BatchInvalid(f"a batch id is 1 to 100 of A-Z a-z 0-9 _ . : -, not {batch_id!r}")
    return f"batch-{batch_id}" + ("-dry" if dry_run else "")


def request_id(batch_id: str, run_id: str) -> str:
    """The id of the request a batch sends to a run: the same on every send."""
    return f"batch/{batch_id}/{run_id}"


@dataclass(frozen=True, slots=True)
class BatchSpec:
    """A batch's payload: the operation, the query, and what the requests carry."""

    batch_id: str
    operation: str
    where: str
    reason: str = ""
    signal: str | None = None
    signal_payload_json: str = "null"
    dry_run: bool = False

    def payload(self) -> dict[str, Any]:
        return {"batch_id": self.batch_id, "operation": self.operation, "where": self.where,
                "reason": self.reason, "signal": self.signal,
                "signal_payload_json": self.signal_payload_json, "dry_run": self.dry_run}

    @classmethod
    def from_payload(cls, payload: Any) -> BatchSpec:
        if not isinstance(payload, dict):
            raise BatchInvalid("a batch's payload is an object")
        try:
            spec = cls(**payload)
        except TypeError as exc:
            raise BatchInvalid(f"a batch's payload: {exc}") from None
        spec.check()
        return spec

    def check(self) -> None:
        self._typed()
        batch_run_id(self.batch_id)
        if self.operation not in OPERATIONS:
            raise BatchInvalid(f"a batch operation is one of {', '.join(OPERATIONS)}, not "
                               f"{self.operation!r}")
        if self.operation == "signal" and not self.signal:
            raise BatchInvalid("a signal batch names its signal")
        if not self.where.strip():
            raise BatchInvalid("a batch needs a query (--where): it never acts on every run "
                               "by default")
        if self.signal is not None:
            try:  # (the name a client would send: no wait takes another)
                check_name("signal", self.signal)
            except NameInvalid as exc:
                raise BatchInvalid(f"a batch's signal: {exc}") from None

    def _typed(self) -> None:
        """Each field of the type a client sends (a plain producer's or a create by name
        failed the batch later: `where: 5` in the matching, `reason: 12` at its first send)."""
        for name, kind in _FIELD_TYPES.items():
            value = getattr(self, name)
            if not isinstance(value, kind) or (kind is str and isinstance(value, bool)):
                raise BatchInvalid(f"a batch's {name} is {_KIND_NAMES[kind]}, not "
                                   f"{type(value).__name__}")
        if self.signal is not None and not isinstance(self.signal, str):
            raise BatchInvalid(f"a batch's signal is text, not {type(self.signal).__name__}")
        try:
            json.loads(self.signal_payload_json)
        except ValueError:
            raise BatchInvalid("a batch's signal_payload_json is not JSON") from None


@dataclass(slots=True)
class BatchProgress:
    """What a batch's journal says so far (progress_of)."""

    batch_id: str
    operation: str
    started_ms: int | None = None
    matched: int = 0
    matching_done: bool = False
    sent: int = 0
    done: int = 0
    refused: int = 0
    refusals: list[tuple[str, str]] = field(default_factory=list)  # MAX_REFUSALS_SHOWN
    first: list[str] = field(default_factory=list)  # DRY_RUN_SHOWN first matches
    last_ms: int | None = None

    @property
    def rate(self) -> float | None:
        """Runs answered per second since the batch started (None: none yet)."""
        if self.started_ms is None or self.last_ms is None or self.last_ms <= self.started_ms:
            return None
        return (self.done + self.refused) / ((self.last_ms - self.started_ms) / 1000)

    def as_dict(self) -> dict[str, Any]:
        return {"batch_id": self.batch_id, "operation": self.operation,
                "matched": self.matched, "matching_done": self.matching_done,
                "sent": self.sent, "done": self.done, "refused": self.refused,
                "refusals": [{"run_id": r, "reason": why} for r, why in self.refusals],
                "first": self.first, "rate_per_s": self.rate}


def steps_of(entries: tuple[JournalEntry, ...]) -> list[tuple[str, Any]]:
    """(step name, result) of a batch's completed steps, from its journal entries."""
    return [(entry.name, json.loads(entry.result_json)) for entry in entries
            if entry.status == "completed" and entry.result_json is not None
            and entry.kind == "step"]


def progress_of(spec: BatchSpec, steps: Iterable[tuple[str, Any]]) -> BatchProgress:
    """A batch's progress from its completed steps' results (steps_of)."""
    progress = BatchProgress(spec.batch_id, spec.operation)
    for name, result in steps:
        if name == "ends":
            progress.started_ms = result["started_ms"]
        elif name.startswith("match-"):
            progress.matched += len(result["ids"])
            progress.matching_done = bool(result["done"])
            room = DRY_RUN_SHOWN - len(progress.first)
            progress.first.extend(result["ids"][:max(room, 0)])
        elif name.startswith("send-"):
            # `again`: lineages matched here and in an earlier chunk (they handed off between
            # them), counted once (absent from a send of an earlier release)
            progress.matched -= result.get("again", 0)
            progress.sent += result["sent"]
            progress.done += result["done"]
            progress.refused += len(result["refused"])
            room = MAX_REFUSALS_SHOWN - len(progress.refusals)
            progress.refusals.extend((r, why) for r, why in result["refused"][:max(room, 0)])
            progress.last_ms = result["at_ms"]
    return progress
