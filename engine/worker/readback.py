"""When the owner reads back its own decisions: after its step path, not in the middle of it.

Every decision the owner produces comes back to it through its consumer, and applying it
(decode, reducer, RocksDB write) costs about as much event-loop time as the step that made
it. Measured on W2 (runs one at a time, two workers), applying the read-back as it arrived
sat in front of the next step's acknowledgement: each step took about 3.4 ms from one
acknowledgement to the next, and about 2.2 ms with the read-back out of the way.

So a poll that holds nothing but decisions, taken while this worker's producer has
decisions unacknowledged, waits until the producer is quiet, for READ_BACK_DEFER_S at most,
before it is applied. It never waits when:
- the poll holds a request (a create, signal, cancel...): those are answered at once;
- anyone awaits the verdict of one of our records (an irreversible step's `step.started`,
  a claim): their wait is the read-back itself.
The records are only applied later, never skipped or reordered, and a create that arrives
meanwhile waits at most READ_BACK_DEFER_S. Under load, polls hold requests and nothing waits.

While it waits, the consumer fetches nothing (engine.worker.kafka_driver.fetches_held): a fetch
then would bring back the next decision of the step path, alone, only to wait in turn. Once the
producer is quiet (or the wait is over), the decisions acknowledged in a row right after the
poll are not fetched: they are applied from their acknowledgements, on a LogAppendTime journal
(engine.worker.kafka_driver.read_ahead; 2.05 worker fetches a W2 run, against 3.20 read as
they came and 2.87 fetched after the wait). What is not acknowledged yet is fetched after.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from runstream.engine.journal.events import RECORD_CLASSES
from runstream.projections.poison import type_header

# Longest a read-back waits for the producer to be quiet: a run's steps follow each other
# within a few ms, and a create behind the read-back waits no longer than this.
READ_BACK_DEFER_S = 0.010

# Whatever is not a decision is answered without waiting.
DECISION_TYPES = frozenset(cls.TYPE for cls in RECORD_CLASSES.values()
                           if cls.KIND == "decision")


class _Message(Protocol):
    @property
    def headers(self) -> Sequence[tuple[str, bytes]] | None: ...


def read_back_waits(busy: bool, awaited: bool, batches: Mapping[Any, Iterable[_Message]]
                    ) -> bool:
    """Only our own decisions, our producer still busy, nobody awaiting a verdict: the
    consume loop applies the poll after the step path."""
    return busy and not awaited and decisions_only(batches)


def decisions_only(batches: Mapping[Any, Iterable[_Message]]) -> bool:
    """Whether every polled record is a decision by its type header (a record without one
    is not: it may be poison, and goes through at once)."""
    found = False
    for messages in batches.values():
        for message in messages:
            if type_header(message.headers) not in DECISION_TYPES:
                return False
            found = True
    return found

