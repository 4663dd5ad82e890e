"""What the worker's helpers may ask of the worker that holds them: one narrow protocol per
helper, each naming only what that helper uses.

The helpers that keep partitions (engine.worker.claims, upkeep, timers, outbox, observe)
take the protocols here; those that decide and execute runs (executor, reactions, forks,
activation, sweep) take those of engine.worker.run_protocols. They are parts of one Worker
(engine.worker.worker), which builds them and satisfies these protocols with public
attributes, properties and methods. A helper holds its protocol, never the Worker: it
cannot reach the worker's private state, and no helper imports engine.worker.worker. What
a helper needs of another helper is a protocol of engine.worker.helper_protocols
(ClaimWriter, LeaseKeeper, ClaimActivation, ...), reached through the worker's attribute at
the time of the call, so a test that replaces a helper's method sees every call.

This module imports only the worker's leaf modules (value types and parts that hold no
worker: ownership, committer, confirmations, watchdog, sticky, deadletters,
helper_protocols), so every helper can import it and no import cycle hides behind it.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer

from runstream.engine.errors import WorkerFatal
from runstream.engine.flow.definition import Flow
from runstream.engine.journal import JournalRecord
from runstream.engine.kafka.connection import KafkaSecurity
from runstream.engine.observability.metrics import WorkerMetrics
from runstream.engine.worker.carried import CarriedCalls
from runstream.engine.worker.committer import Committer
from runstream.engine.worker.confirmations import Confirmations
from runstream.engine.worker.deadletters import DeadLetterCopier
from runstream.engine.worker.helper_protocols import (
    ClaimActivation,
    ClaimWriter,
    Execution,
    LeaseKeeper,
)
from runstream.engine.worker.ownership import Ownership
from runstream.engine.worker.sticky import StickyCache
from runstream.engine.worker.watchdog import LoopWatchdog
from runstream.projections.projector import Projector
from runstream.projections.schedule_state import ScheduleState
from runstream.projections.state import RunState
from runstream.projections.store import ProjectionStore

# What each helper asks of the worker.


class DeadlineReactions(Protocol):
    def on_deadline(self, own: Ownership, run: RunState) -> bool:
        """The run's deadline entry fell due: act on it (projections.deadlines.on_deadline);
        whether anything was sent."""

    def on_schedule_due(self, own: Ownership, schedule: ScheduleState) -> bool:
        """The schedule fell due: fire (projections.schedule_owner.on_due); whether anything
        was sent."""


class TimerOwner(Protocol):
    """What the timer sweeper (engine.worker.timers) uses."""

    @property
    def reactions(self) -> DeadlineReactions:
        """The owner's reactions: a due deadline is theirs to act on."""

    @property
    def owned(self) -> dict[int, Ownership]:
        """The partitions assigned here: due timers are fired in the executing ones."""

    @property
    def store(self) -> ProjectionStore | None:
        """The projection: its timer index and the runs it names (None: not started)."""

    def enqueue(self, own: Ownership, run: RunState, cls: type[JournalRecord],
                **body: Any) -> asyncio.Future[None]:
        """Queue a decision about `run` under `own`'s epoch: a `timer.fired`."""


class SnapshotOwner(Protocol):
    """What the snapshot keeper and loader (engine.worker.snapshots, restore) use."""

    @property
    def owned(self) -> dict[int, Ownership]:
        """The partitions assigned here: the executing ones are snapshotted."""

    @property
    def store(self) -> ProjectionStore | None:
        """The projection a snapshot is frozen from and loaded into."""

    @property
    def projector(self) -> Projector | None:
        """Partition states (the newest anchored snapshot); applies a loaded tail."""

    @property
    def source_id(self) -> str:
        """This source's id, on each anchor."""

    @property
    def committer(self) -> Committer:
        """Sends the anchors."""

    @property
    def metrics(self) -> WorkerMetrics:
        """runstream_snapshots, runstream_restore_*."""

    @property
    def data_dir(self) -> Path:
        """Where frozen checkpoints are made (next to the projection, same filesystem)."""

    @property
    def partitions(self) -> int:
        """The journal's partition count (which keys are a partition's)."""

    @property
    def bootstrap(self) -> str:
        """The brokers."""

    @property
    def name(self) -> str:
        """The worker's name, on each manifest."""

    @property
    def security(self) -> KafkaSecurity | None:
        """SASL/TLS (None: from the RUNSTREAM_* environment)."""

    @property
    def topic(self) -> str:
        """The journal topic (a load folds its tail)."""

    @property
    def snapshot_topic(self) -> str:
        """`<ns>.snapshots`."""

    @property
    def stopping(self) -> bool:
        """A stop began: a claim's loads are no longer tried again."""


class RetentionOwner(Protocol):
    """What the retention sweeper (engine.worker.retention) uses."""

    @property
    def owned(self) -> dict[int, Ownership]:
        """The partitions assigned here: the executing ones are swept."""

    @property
    def store(self) -> ProjectionStore | None:
        """The projection: its settle and tombstone indexes (None: not started)."""

    @property
    def projector(self) -> Projector | None:
        """Partition states and what the store holds of a lineage."""

    @property
    def retention_ms(self) -> int:
        """The retention this worker applies (0: settled runs are kept forever)."""

    @property
    def source_id(self) -> str:
        """This source's id, on each expiry decision."""

    @property
    def committer(self) -> Committer:
        """Sends the expiry decisions."""


class OutboxOwner(Protocol):
    """What the outbox sender (engine.worker.outbox) uses."""

    @property
    def owned(self) -> dict[int, Ownership]:
        """The partitions assigned here: only the executing ones send their outbox."""

    @property
    def store(self) -> ProjectionStore | None:
        """The projection: its outbox index, re-sent whole on a claim."""

    @property
    def projector(self) -> Projector | None:
        """The partition's next offset, the place of a given-up request's dead letter."""

    @property
    def partitions(self) -> int:
        """The journal's partition count: a request goes to its lineage's partition."""

    @property
    def source_id(self) -> str:
        """This source's id, on each `partition.outbox-sent`."""

    @property
    def committer(self) -> Committer:
        """The producer requests and their acknowledgements are queued on."""

    @property
    def dead_letters(self) -> DeadLetterCopier:
        """The journal's copier: a given-up request's copier is made alike."""

    @property
    def stopping(self) -> bool:
        """A stop began: retrying a dead letter's copy ends."""

    def enqueue(self, own: Ownership, run: RunState, cls: type[JournalRecord],
                **body: Any) -> asyncio.Future[None]:
        """Queue a decision: evidence on a run whose request was given up."""

    def current_run(self, run_id: str) -> RunState | None:
        """The run that sent a given-up request, if it still is one of ours."""


class UpkeepOwner(Protocol):
    """What the upkeep (engine.worker.upkeep: heartbeats, offsets, lease reclaims) uses."""

    @property
    def owned(self) -> dict[int, Ownership]:
        """The partitions assigned here: heartbeats and offsets of the executing ones."""

    @property
    def projector(self) -> Projector | None:
        """Each partition's next offset, owner, last write and lease."""

    @property
    def consumer(self) -> AIOKafkaConsumer | None:
        """The group member whose offsets are committed."""

    @property
    def topic(self) -> str:
        """The journal topic the offsets are of."""

    @property
    def lease_ms(self) -> int:
        """Our lease: heartbeats are sent a quarter of it after our last write."""

    @property
    def source_id(self) -> str:
        """This source's id, on each heartbeat."""

    @property
    def committer(self) -> Committer:
        """The producer heartbeats are queued on."""

    @property
    def stopping(self) -> bool:
        """A stop began: a lease that runs out claims nothing any more."""

    @property
    def claims(self) -> ClaimWriter:
        """Writes the claim once a silent owner's lease ran out."""


class ObservedOwner(Protocol):
    """What the metrics observer (engine.worker.observe) uses."""

    @property
    def flows(self) -> Mapping[str, Flow[Any, Any]]:
        """The registered flows: the gauges' flow labels (others are `other`)."""

    @property
    def owned(self) -> dict[int, Ownership]:
        """The partitions assigned here: a scrape adds up their gauges."""

    @property
    def store(self) -> ProjectionStore | None:
        """The runs of a partition, counted when our claim of it applies."""

    @property
    def projector(self) -> Projector | None:
        """What each partition applied: the consumer lag's other end."""

    @property
    def consumer(self) -> AIOKafkaConsumer | None:
        """The assignment and its end offsets, for the consumer lag."""

    @property
    def data_dir(self) -> Path:
        """Where a large partition's runs are frozen to be counted off the event loop."""


class SnapshotSteps(Protocol):
    """The snapshot steps of a claim and a release (engine.worker.takeover)."""

    async def bring_up(self, ends: dict[int, int], starts: dict[int, int]) -> None:
        """Before claims: load a snapshot where the store is far enough behind one (the
        journal's end offsets `ends`) or needs records below a log start (`starts`) the
        broker deleted; WorkerFatal when no snapshot covers them."""

    async def on_release(self, own: Ownership, seconds_left: float) -> None:
        """A graceful release: a snapshot if it fits in the time left."""

    def forget(self, partition: int) -> None:
        """The partition is no longer ours."""


class ClaimsOwner(Protocol):
    """What the claims (engine.worker.claims: claim, renew, release, lose, confirm) use."""

    @property
    def name(self) -> str:
        """This worker's name: the owner its claims name, and log lines."""

    @property
    def instance_id(self) -> str | None:
        """Its static group membership (--instance-id), named when another worker took it."""

    @property
    def security(self) -> KafkaSecurity | None:
        """SASL/TLS: a source refused by the ACLs is named in their terms."""

    @property
    def topic(self) -> str:
        """The journal topic: the claimed partitions are sought in it."""

    @property
    def partitions(self) -> int:
        """The journal's partition count the worker places runs by (read at its start)."""

    @property
    def data_dir(self) -> Path:
        """Named when the projection is ahead of its topic (the topic was recreated)."""

    @property
    def lease_ms(self) -> int:
        """The lease each claim carries."""

    @property
    def retention_ms(self) -> int:
        """The retention each claim carries (0: settled runs are kept forever)."""

    @property
    def tombstone_retention_ms(self) -> int:
        """How long tombstones are kept, in each claim."""

    @property
    def drain_timeout(self) -> float:
        """How long a release waits for its partitions' executions."""

    @property
    def owned(self) -> dict[int, Ownership]:
        """The partitions assigned here: the claims add, replace and drop them."""

    @property
    def store(self) -> ProjectionStore | None:
        """The projection a claim's activation answers from."""

    @property
    def projector(self) -> Projector | None:
        """Each partition's restored offset and epoch: where to seek and claim over."""

    @property
    def consumer(self) -> AIOKafkaConsumer | None:
        """The group member: its generation, seeks and end offsets."""

    @property
    def source_id(self) -> str:
        """This source's id, on claims and heartbeats."""

    @property
    def committer(self) -> Committer:
        """This source's producer: claims, heartbeats and releases are queued on it; its
        failure is why a source is renewed."""

    @property
    def stopping(self) -> bool:
        """A stop began: asking again for end offsets ends."""

    @property
    def watchdog(self) -> LoopWatchdog:
        """The event loop's stalls, after which ownership is confirmed."""

    @property
    def metrics(self) -> WorkerMetrics:
        """Claims' verdicts, and the gauges of a lost partition forgotten."""

    @property
    def confirmations(self) -> Confirmations:
        """Our decisions in flight: abandoned with an ownership; a heartbeat's verdict."""

    @property
    def sticky(self) -> StickyCache:
        """Parked handlers, evicted with their partitions."""

    @property
    def executions(self) -> Mapping[str, Execution]:
        """The runs executing here: drained, cancelled or released with their partition."""

    @property
    def carried(self) -> CarriedCalls:
        """Irreversible calls a release keeps running; cut when their partition goes."""

    @property
    def refused(self) -> OrderedDict[str, str]:
        """Runs whose record the broker refused: a renewal remembers the failed source's."""

    @property
    def activator(self) -> ClaimActivation:
        """Told of every applied claim; activates a partition once ours applied."""

    @property
    def upkeep(self) -> LeaseKeeper:
        """Claims again after a rejected claim's lease ran out."""

    @property
    def takeovers(self) -> SnapshotSteps:
        """Loads snapshots before claims, takes them on releases."""

    def enqueue(self, own: Ownership, run: RunState, cls: type[JournalRecord],
                **body: Any) -> asyncio.Future[None]:
        """Queue a decision: a `run.released` for a run of a released partition."""

    def fail_next_turn(self, fatal: WorkerFatal) -> None:
        """The consume loop raises `fatal` at its next turn, which stops the worker: aiokafka
        swallows the exception of a rebalance listener, where the claims run."""

    async def replace_source(self, failed: Committer) -> None:
        """Close the `failed` source's producer aside and start a new source, waiting for
        the brokers while they do not answer."""
