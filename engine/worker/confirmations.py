"""What a worker knows of its own decisions between sending them and applying them.

Two bounded maps: the verdicts someone awaits (an irreversible step waits until its
`step.started` is applied: bounded by those steps in flight), and, per subject (a run, or a
schedule: projections.reactions.subject_of), the sequence of the last decision sent about it
(bounded by the subjects with decisions in flight). The owner reacts to a run's state only
once the run has no decision of ours in flight, so it never acts on a state its own records
are about to change.

And what it knows of the decisions it never saw confirmed (NotCalled): irreversible step
attempts whose `step.started` went unconfirmed, so their function was never called.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from runstream.engine.journal import JournalRecord
from runstream.projections.reactions import subject_of
from runstream.projections.state import Verdict


class Confirmations:
    def __init__(self) -> None:
        self._waiters: dict[tuple[int, int], asyncio.Future[Verdict]] = {}
        self._in_flight: dict[str, tuple[int, int]] = {}  # subject -> (partition, seq)

    def sent(self, subject: str, partition: int, seq: int) -> None:
        self._in_flight[subject] = (partition, seq)

    def in_flight(self, run_id: str) -> bool:
        return run_id in self._in_flight

    def awaited(self) -> bool:
        """Whether anyone awaits the verdict of one of our records."""
        return bool(self._waiters)

    def expect(self, partition: int, seq: int) -> asyncio.Future[Verdict]:
        """A future for the verdict this worker's projection gives our record `seq`."""
        waiter: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
        self._waiters[(partition, seq)] = waiter
        return waiter

    def applied(self, partition: int, record: JournalRecord, verdict: Verdict) -> bool:
        """Our record is in the projection: wake whoever awaits its verdict. True when it
        was the last decision we sent about its subject (its run, or its schedule)."""
        seq = record.envelope.source_seq or 0
        waiter = self._waiters.pop((partition, seq), None)
        if waiter is not None and not waiter.done():
            waiter.set_result(verdict)
        subject = subject_of(record.envelope.run_id, record.envelope.lineage_id)
        if self._in_flight.get(subject) == (partition, seq):
            del self._in_flight[subject]
            return True
        return False

    def abandon(self, partitions: set[int] | None = None) -> None:
        """Nothing more will be applied here for these partitions (all when None): whoever
        waits is fenced, and nothing of ours is in flight there any more."""
        for key in [k for k in self._waiters if partitions is None or k[0] in partitions]:
            waiter = self._waiters.pop(key)
            if not waiter.done():
                waiter.set_result(Verdict.fenced)
        for subject in [r for r, (p, _) in self._in_flight.items()
                        if partitions is None or p in partitions]:
            del self._in_flight[subject]


MAX_NOT_CALLED = 10_000


class NotCalled:
    """Irreversible step attempts this worker sent `step.started` for and never called,
    unable to journal so under the source that sent them (it failed, or the partition was
    lost): the latest MAX_NOT_CALLED (run id, position, attempt). Only this process knows;
    another owner quarantines such a step, as it must."""

    def __init__(self) -> None:
        self._attempts: OrderedDict[tuple[str, int, int], None] = OrderedDict()

    def remember(self, run_id: str, position: int, attempt: int) -> None:
        self._attempts[(run_id, position, attempt)] = None
        while len(self._attempts) > MAX_NOT_CALLED:
            self._attempts.popitem(last=False)

    def known(self, run_id: str, position: int, attempt: int) -> bool:
        return (run_id, position, attempt) in self._attempts
