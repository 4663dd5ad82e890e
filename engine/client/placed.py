"""Where a client's request went, and what the reducer made of it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from runstream.engine.errors import RunstreamError
from runstream.engine.journal import JournalRecord
from runstream.projections.state import RunState, Tombstone, Verdict
from runstream.projections.updates import lineage_rounds


class RequestNotRelayed(RunstreamError):
    """A request sent to the requests topic did not reach the journal in time."""


@dataclass(frozen=True, slots=True)
class Placed:
    """Where a request went: its journal partition, and its journal offset (direct) or the
    partition's end offset read before it was sent (relayed: it lands at or past it)."""

    partition: int
    offset: int
    relayed: bool
    source: str | None = None  # relayed: "<topic>:<partition>:<offset>" on its requests topic


@dataclass(frozen=True, slots=True)
class RequestAnswer:
    """A request this client produced, and what the reducer made of it (read model)."""

    record: JournalRecord
    partition: int
    offset: int
    verdict: Verdict | None  # None: the read model holds no record at that offset
    run: RunState | None  # the run as the read model sees it now
    tombstone: Tombstone | None = None  # what is left of it, when it has expired

    @property
    def run_missing(self) -> bool:
        """The run did not exist when the request reached it (verdict `ignored`, no run)."""
        if self.verdict not in (None, Verdict.ignored):
            return False
        return self.run is None or self.run.request_offset > self.offset


def round_live_at(run_of: Callable[[str], RunState | None], latest: RunState,
                  offset: int) -> RunState | None:
    """The round of `latest`'s lineage that was live when a request at `offset` (of its
    partition) applied: the last created before it. A request to a lineage that hands off
    right after it lands is in that round's history, neither round 0's nor the latest's."""
    if latest.request_offset < offset:
        return latest
    took = None
    for held in lineage_rounds(run_of, latest.lineage_id, latest.run_id):
        if held.request_offset >= offset:  # (rounds come in creation order: the rest later)
            break
        took = held
    return took
