"""What the worker's helpers ask of one another: one narrow protocol per use, each satisfied
by that helper's class (the claims, upkeep, activator, reactions, timer sweeper, outbox
sender and run executions of engine.worker).

The protocols of engine.worker.partition_protocols and run_protocols (what each helper asks of the
worker) name these as the types of the worker's attributes that hold the other helpers; a helper
reaches another through that attribute at the time of the call, so a test that replaces a
helper's method sees every call. Like them, this module imports only leaf modules (value
types, the pure projections.owner), never a helper that holds these protocols, so no import
cycle hides behind it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Protocol

from runstream.engine.worker.ownership import Ownership
from runstream.projections.reactions import Interrupt, OwnerView, Reaction, Start
from runstream.projections.schedule_state import ScheduleState
from runstream.projections.state import OutboxItem, RunState
from runstream.projections.store import ProjectionStore


class ClaimWriter(Protocol):
    """The worker's claims (engine.worker.claims.Claims), as its upkeep uses them."""

    def write_claim(self, own: Ownership, epoch: int) -> None:
        """Queue a claim of `own`'s partition over `epoch` (a lease ran out: claim again)."""


class LeaseKeeper(Protocol):
    """The worker's upkeep (engine.worker.upkeep.Upkeep), as its claims use it."""

    def reclaim_after_lease(self, own: Ownership) -> None:
        """Our claim was rejected: claim again once the owner stayed silent for its lease."""


class OwnershipConfirmer(Protocol):
    """The worker's claims, as a run execution uses them before each step."""

    async def confirm(self, own: Ownership) -> None:
        """Return once `own` is confirmed since the event loop's latest stall."""


class ClaimActivation(Protocol):
    """The worker's activator (engine.worker.activation.Activator), as its claims use it."""

    def owner_seen(self, source_id: str, name: str) -> None:
        """An applied claim names the owner of `source_id` (for later evidence)."""

    def activate_partition(self, own: Ownership, store: ProjectionStore) -> None:
        """Our claim applied: re-send the outbox, answer and start what waits."""

    def left_behind(self, run_id: str) -> None:
        """The execution of `run_id` ignored its cancellation: forget it, so the run can
        start again here."""


class OwnerNames(Protocol):
    """The worker's activator, as a run execution uses it for its activation's evidence."""

    def owner_name(self, source_id: str) -> str:
        """The name of the owner that wrote under `source_id`, as far as we know it."""


class Execution(Protocol):
    """A run executing here (engine.worker.executor.RunExecution), as the claims see it
    when they release, lose or renew its partition."""

    @property
    def ownership(self) -> Ownership:
        """The ownership it executes under: released with it."""

    @property
    def run(self) -> RunState:
        """Its run as the execution started it (the id, for release records and logs)."""

    @property
    def task(self) -> asyncio.Task[None] | None:
        """Its task, drained or cancelled."""

    @property
    def activated(self) -> bool:
        """Its activation was sent: a release must be journaled unless it settled."""

    @property
    def settled(self) -> bool:
        """Nothing to release: settled, suspended, or never activated."""

    # Set by a release before it cancels the handler: an irreversible call is kept running.
    carrying: bool


class Launcher(Protocol):
    """The worker's activator, as its reactions use it."""

    def launch(self, own: Ownership, start: Start) -> None:
        """Execute the run projections.owner says to start, unless it executes here."""

    def interrupt(self, interrupt: Interrupt) -> None:
        """Cancel the handler of a run whose deadline passed, if it executes here."""

    def slot_free(self, flow: str) -> bool:
        """A run of `flow` launched now gets a slot at once."""


class ClaimReactions(Protocol):
    """The worker's reactions (engine.worker.reactions.Reactions), as a claim's sweep uses
    them."""

    def on_schedule_claim(self, own: Ownership, schedule: ScheduleState) -> None:
        """The claim's sweep reaches a schedule (projections.schedule_owner.on_claim)."""

    def on_claim(self, own: Ownership, run: RunState) -> None:
        """The sweep reached `run`: act on it as projections.owner.swept says."""


class ActivationReactions(ClaimReactions, Protocol):
    """The worker's reactions, as its activator (and the activator's sweeps) use them."""

    def view(self, own: Ownership) -> OwnerView:
        """What projections.owner needs to know of the worker under `own`: the activator
        asks it for a claim's requests and for a run to start."""

    def act(self, own: Ownership, reactions: Iterable[Reaction]) -> None:
        """Carry out projections.owner's answer (raises WorkerFatal when the source failed)."""

    def react(self, own: Ownership, run: RunState, *, claiming: bool = False,
              woken: bool = False) -> None:
        """Act on `run` as it stands: a wake found an execution still unwinding from its
        suspension, which has ended now."""


class AppliedOutbox(Protocol):
    """The worker's outbox sender (engine.worker.outbox.OutboxSender), as its reactions use
    it."""

    def add(self, own: Ownership, items: tuple[OutboxItem, ...] | list[OutboxItem]) -> None:
        """Requests to other runs an applied record caused: sent after the poll."""


class ClaimOutbox(Protocol):
    """The worker's outbox sender, as its activator uses it."""

    def resend(self, own: Ownership) -> None:
        """Our claim applied: send again everything the partition's outbox still holds."""


class AppliedTimers(Protocol):
    """The worker's timer sweeper (engine.worker.timers.TimerSweeper), as its reactions use
    it."""

    def applied(self, run_id: str) -> None:
        """A record that ends or replaces the run's wait applied: its fired timer is done."""

    def poke(self) -> None:
        """A run suspended with a timer: sweep now, it may fall due before the next sweep."""


class JudgedExpiries(Protocol):
    """The worker's retention sweeper (engine.worker.retention), as its reactions use it."""

    def judged(self, partition: int) -> None:
        """An expiry decision of `partition` got its verdict: the next may be sent."""


class ClaimTimers(Protocol):
    """The worker's timer sweeper, as its activator uses it."""

    def reset(self) -> None:
        """Our claim applied: timers fired under an earlier ownership may never apply."""
