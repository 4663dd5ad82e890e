"""What the helpers that decide and execute runs ask of the worker that holds them: the run
executions (engine.worker.executor), the reactions to applied records (reactions), the
source side of forks (forks), the activator (activation) and its claim sweeps (sweep).

The same rule as engine.worker.partition_protocols, which holds the protocols of the helpers that
keep partitions (claims, upkeep, timers, outbox, observer): one narrow protocol per helper,
public names only, satisfied by the Worker; what a helper asks of another helper is a
protocol of engine.worker.helper_protocols. A helper that builds another hands it its own
owner, so its protocol extends the other's: ReactionsOwner extends ForkOwner (the reactions
build the fork answers), ActivationOwner extends ExecutionOwner and ClaimSweepOwner (the
activator builds run executions and the claim sweeps). This module imports only leaf
modules, never a helper that holds these protocols.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

from runstream.engine.flow.definition import Flow
from runstream.engine.journal import JournalRecord
from runstream.engine.kafka.connection import KafkaSecurity
from runstream.engine.observability.metrics import WorkerMetrics
from runstream.engine.worker.admission import Admission
from runstream.engine.worker.carried import CarriedCalls
from runstream.engine.worker.committer import Committer
from runstream.engine.worker.confirmations import Confirmations, NotCalled
from runstream.engine.worker.helper_protocols import (
    ActivationReactions,
    AppliedOutbox,
    AppliedTimers,
    ClaimOutbox,
    ClaimReactions,
    ClaimTimers,
    Execution,
    JudgedExpiries,
    Launcher,
    OwnerNames,
    OwnershipConfirmer,
)
from runstream.engine.worker.ownership import Ownership
from runstream.engine.worker.sticky import StickyCache
from runstream.projections.state import RunState
from runstream.projections.store import ProjectionStore


class ExecutionOwner(Protocol):
    """What a run execution (engine.worker.executor.RunExecution) uses."""

    @property
    def name(self) -> str:
        """This worker's name, in the `step.failed` of an attempt not called."""

    @property
    def durable_backoff_after_ms(self) -> int:
        """A retry backoff longer than this is waited on a durable timer."""

    @property
    def flows(self) -> Mapping[str, Flow[Any, Any]]:
        """The registered flows: a child's flow by name."""

    @property
    def store(self) -> ProjectionStore | None:
        """The run's journal entries, replayed by its handler."""

    @property
    def metrics(self) -> WorkerMetrics:
        """Each step's duration and outcome."""

    @property
    def admission(self) -> Admission:
        """The execution slots, taken while the handler runs."""

    @property
    def committer(self) -> Committer:
        """This source's producer: the sequence an irreversible step's confirmation awaits;
        its failure, after which nothing of ours can apply."""

    @property
    def confirmations(self) -> Confirmations:
        """The verdict an irreversible step's `step.started` awaits."""

    @property
    def not_called(self) -> NotCalled:
        """Irreversible attempts this worker knows it never called."""

    @property
    def carried(self) -> CarriedCalls:
        """Irreversible calls a release kept running, until their run takes them again."""

    @property
    def sticky(self) -> StickyCache:
        """Where a suspended handler parks."""

    @property
    def activator(self) -> OwnerNames:
        """The previous owner's name, for a continued activation's evidence."""

    @property
    def claims(self) -> OwnershipConfirmer:
        """Confirms ownership after a stall, before each step."""

    def enqueue(self, own: Ownership, run: RunState, cls: type[JournalRecord],
                **body: Any) -> asyncio.Future[None]:
        """Queue a decision about the run under its ownership's epoch."""

    def current_run(self, run_id: str) -> RunState | None:
        """The run as the projection holds it now."""


class ForkOwner(Protocol):
    """What the fork answers (engine.worker.forks: the source side of forks) use."""

    @property
    def store(self) -> ProjectionStore | None:
        """The source's history index (its records' offsets) and journal entries."""

    @property
    def bootstrap(self) -> str:
        """The brokers the source's records are read back from."""

    @property
    def topic(self) -> str:
        """The journal topic they are read from."""

    @property
    def security(self) -> KafkaSecurity | None:
        """How to reach the brokers (None: from RUNSTREAM_*, engine.kafka.connection)."""

    def enqueue(self, own: Ownership, run: RunState, cls: type[JournalRecord],
                **body: Any) -> asyncio.Future[None]:
        """Queue the answer's `run.fork-answered` decisions about the source run."""

    def current_run(self, run_id: str) -> RunState | None:
        """The source run as it is now: still ours, and still asking for the fork?"""


class ReactionsOwner(ForkOwner, Protocol):
    """What the reactions (engine.worker.reactions) use, and, through it, their fork
    answers (ForkOwner: the reactions build them)."""

    @property
    def owned(self) -> dict[int, Ownership]:
        """The partitions assigned here (a verdict reached after its partition moved is
        not journaled from here)."""

    @property
    def flows(self) -> Mapping[str, Flow[Any, Any]]:
        """The registered flows: creates are checked and limited by them, runs started."""

    @property
    def name(self) -> str:
        """This worker's name, in the evidence of a run whose flow it does not register."""

    @property
    def store(self) -> ProjectionStore | None:
        """The runs' journal entries: a wait's outcome, a fork's prefix to copy."""

    @property
    def confirmations(self) -> Confirmations:
        """Our decisions not applied yet: a run with some is left to the last of them."""

    @property
    def executions(self) -> Mapping[str, Execution]:
        """The runs executing here: one of them is not started again."""

    @property
    def refused(self) -> OrderedDict[str, str]:
        """Runs whose record the broker refused: failed (or their create rejected) instead
        of re-executed, and forgotten once answered."""

    @property
    def carried(self) -> CarriedCalls:
        """Calls kept through a release: cut when their run settles."""

    @property
    def sticky(self) -> StickyCache:
        """Parked handlers, continued when their wait's wake applies."""

    @property
    def outbox(self) -> AppliedOutbox:
        """Takes the requests to other runs that an applied record caused."""

    @property
    def timers(self) -> AppliedTimers:
        """Told when a run's wait ends or a new one with a timer begins."""

    @property
    def retention(self) -> JudgedExpiries:
        """Told when an expiry decision of a partition got its verdict."""

    @property
    def activator(self) -> Launcher:
        """Starts the runs projections.owner says to start."""

    def enqueue(self, own: Ownership, run: RunState, cls: type[JournalRecord],
                **body: Any) -> asyncio.Future[None]:
        """Queue a decision projections.owner wrote about `run` under `own`'s epoch."""

    def current_run(self, run_id: str) -> RunState | None:
        """The run as it is now: the size of its payload, when the broker refused one of
        its records (was it its run.created?)."""


class ClaimSweepOwner(Protocol):
    """What the claim-time sweeps (engine.worker.sweep) use."""

    @property
    def owned(self) -> dict[int, Ownership]:
        """The partitions assigned here: a sweep ends once its ownership is not current."""

    @property
    def store(self) -> ProjectionStore | None:
        """The projection a sweep reads: it ends once that store is closed or replaced."""

    @property
    def stopping(self) -> bool:
        """A stop began: the sweeps end."""

    @property
    def executions(self) -> Mapping[str, Execution]:
        """The runs executing here: left to their execution."""

    @property
    def confirmations(self) -> Confirmations:
        """Our decisions not applied yet: a run with some is left to the last of them."""

    @property
    def reactions(self) -> ClaimReactions:
        """Acts on each run swept."""


class ActivationOwner(ExecutionOwner, ClaimSweepOwner, Protocol):
    """What the activator (engine.worker.activation) uses, and, through it, the run
    executions it starts (ExecutionOwner) and its claim sweeps (ClaimSweepOwner)."""

    @property
    def flows(self) -> Mapping[str, Flow[Any, Any]]:
        """The registered flows: a run started executes its flow's handler."""

    @property
    def concurrency(self) -> int:
        """The execution slots: a run that will get one is activated in the same turn."""

    @property
    def stopping(self) -> bool:
        """A stop began: an execution that ended is not started again."""

    @property
    def outbox(self) -> ClaimOutbox:
        """Sends a claimed partition's outbox again."""

    @property
    def timers(self) -> ClaimTimers:
        """Forgets the timers fired under an earlier ownership, at a claim."""

    @property
    def retention(self) -> ClaimTimers:
        """Forgets the expiry decisions sent under an earlier ownership, at a claim."""

    @property
    def reactions(self) -> ActivationReactions:
        """Answers a claim's requests, starts runs, reacts to a run whose execution ended
        while a wake found it unwinding."""

    def current_run(self, run_id: str) -> RunState | None:
        """The run as it is now, when its execution ends: to be started again?"""
