"""The seam between a flow's context and whoever journals its decisions (a worker's
execution, the test environment), and the control-flow exceptions that cross it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from runstream.engine.journal import events as ev
from runstream.projections.state import JournalEntry, RunState, Wait

# The error type of a step.failed that says an irreversible step's function was never
# called for that attempt (its step.started was not confirmed): it is retried, never
# quarantined.
NOT_CALLED = "NotCalled"


class RunReleased(BaseException):
    """The worker is giving this run up (rebalance, shutdown, fencing).

    A BaseException so that a handler's `except Exception` cannot swallow it.
    """


class Quarantined(BaseException):
    """An irreversible step started and its outcome is unknown: an operator must decide."""

    def __init__(self, entry: JournalEntry, cause: BaseException | None = None) -> None:
        if cause is None:
            why = f"started (attempt {entry.attempts + 1}) with no recorded outcome"
        else:
            why = (f"raised {type(cause).__name__}: {cause} (attempt {entry.attempts + 1}), "
                   f"which does not prove the effect did not happen")
        super().__init__(f"irreversible step {entry.name!r} at position {entry.position} {why}")
        self.entry = entry
        self.cause = cause


# The kinds of activation that take a run over from an earlier owner
# (projections.decide.plan_activation).
TAKEOVER_MODES = frozenset({"claimed", "stolen"})


def takeover_of(mode: str, evidence: str) -> tuple[str, str] | None:
    """An activation's (mode, evidence) when it takes the run over (quarantine_message)."""
    return (mode, evidence) if mode in TAKEOVER_MODES else None


def quarantine_message(quarantine: Quarantined,
                       takeover: tuple[str, str] | None = None) -> str:
    """The quarantine's evidence. A step found started with no outcome by a takeover
    (`takeover`: that activation's mode and evidence) says how its earlier owner left it: a
    release ("claimed") cuts a step still running when the worker's drain ends (kept only
    by a worker the partition comes back to: engine.flow.carried), and a rebalance (a
    peer's death, a join) revokes a healthy worker's partitions too; a run
    "stolen" was never released (its owner died or lost its session): no drain cut it."""
    left = ""
    if quarantine.cause is None and takeover is not None:
        mode, evidence = takeover
        left = f" It was running when its owner changed ({evidence})"
        left += ("; a release cuts a step still running when the worker's drain ends "
                 "(runstream worker --drain-timeout, 10 s by default), unless the partition "
                 "comes back to that worker, which keeps the call." if mode == "claimed"
                 else ".")
    return (f"{quarantine}; it may or may not have taken effect.{left} Check the effect, "
            f"then resume the run with the step's outcome")


class Suspend(BaseException):
    """The handler waits: the executor journals `run.suspended` and drops the handler."""

    def __init__(self, wait: Wait) -> None:
        super().__init__(f"waiting: {wait.kind} at position {wait.position}")
        self.wait = wait


class JournalPort(Protocol):
    """The executor side of a context: journals decisions for this run.

    Decisions go out without waiting; `barrier` waits until the step outcomes sent so far
    are acknowledged by the broker, so that no step's effect depends on a predecessor's
    result that could still be lost, and nothing else waits (one round trip per step).
    """

    def send(self, cls: type[ev.JournalRecord], **body: Any) -> None:
        """Queue one decision about this run (a step outcome or journaled value)."""

    def hold_step(self, body: dict[str, Any], irreversible: bool) -> None:
        """A step's outcome: sent with this run's next decision, or inside its completion
        (engine.flow.held); an irreversible step's at once."""

    async def barrier(self) -> None:
        """Return once every step outcome sent so far is acknowledged."""

    async def send_confirmed(self, cls: type[ev.JournalRecord], **body: Any) -> None:
        """Send, and return only once this worker's projection has applied the record (not
        fenced): the gate before an irreversible effect."""

    def ensure_active(self) -> None:
        """Raise RunReleased if the worker no longer executes this run."""

    def on_step(self, name: str, seconds: float, ok: bool) -> None:
        """One attempt of a step's function took `seconds` (for metrics)."""

    def never_called(self, position: int, attempt: int) -> bool:
        """Whether this worker knows that attempt `attempt` of the irreversible step at
        `position`, journaled started, never had its function called (its step.started was
        never confirmed, and the source that could have said so failed): a retry, not a
        quarantine."""

    def carried_call(self, position: int, attempt: int) -> asyncio.Future[Any] | None:
        """Attempt `attempt`'s call of the irreversible step at `position`, journaled started,
        when this worker kept it running through a release of the run's partition
        (engine.flow.carried): its outcome is journaled instead of quarantining the run."""

    def carry(self, position: int, attempt: int, call: asyncio.Future[Any]) -> bool:
        """The handler is being cancelled while that call runs: whether the worker keeps the
        call (a release it may get the partition back from) rather than have it cancelled."""

    def now_ms(self) -> int:
        """The current time (the wall clock, or a test environment's virtual clock)."""

    @property
    def durable_backoff_after_ms(self) -> int:
        """A retry backoff longer than this suspends the run on a durable timer; a shorter
        one is slept in memory (the worker's setting)."""

    @property
    def timed_out(self) -> bool:
        """The run's deadline passed and its handler was interrupted (its task cancelled):
        a step attempt cut short is journaled failed with RunTimedOut, not retried."""

    def run_state(self) -> RunState:
        """The run as the owner's projection holds it now: signals, cancel, children."""

    def entry(self, position: int) -> JournalEntry | None:
        """The run's journal entry at `position` as projected now (a child's outcome
        arrives in its spawn's entry while the parent runs)."""

    def result_loader(self, flow: str) -> Callable[[str], Any] | None:
        """How flow `flow`'s results load, as registered here (None: it is not)."""

    async def quarantine(self, quarantine: Quarantined) -> Quarantined:
        """Journal the quarantine (its evidence and run.suspended) and return it to raise:
        from then on nothing of this handler is journaled, as a suspended one's."""

    async def suspend(self, wait: Wait) -> JournalEntry | None:
        """Journal the wait. Raises Suspend (the handler is dropped and replayed when the
        wait ends), or, with a sticky cache, returns the wait's outcome entry once woken
        (None: woken without an outcome, e.g. for a cancel)."""


class Slots(Protocol):
    """Execution slots (engine.worker.admission.Admission: a worker's, a TestEnvironment's)."""

    def at_limit(self, flow: str) -> bool: ...
    def held(self, flow: str) -> int: ...
    async def acquire(self, flow: str) -> None: ...
    def release(self, flow: str) -> None: ...


def suspension(wait: Wait) -> dict[str, Any]:
    """The fields of the run.suspended record that journals `wait`."""
    return {"reason": wait.kind, "position": wait.position, "wake_at_ms": wait.due_ms,
            "event_name": wait.event_name, "child_run_id": wait.child_run_id,
            "child_position": wait.child_position}
