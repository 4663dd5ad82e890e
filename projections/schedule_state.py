"""A schedule's state in a projection (projections.schedules folds it): what its records say.

A schedule lives on the journal keyed like a run (its id is the Kafka key, so one partition
owns it), but it is not a run: its records carry `schedule_id` and an empty run id, and its
state is kept under its own keys (projections.keys.schedule_key, the fire index).
"""

from __future__ import annotations

from collections.abc import Callable

from runstream.projections.cron import jitter_ms
from runstream.projections.state import _Frozen, replace

MAX_RUNNING = 64  # runs of one schedule not settled yet that it keeps track of (allow_all)
MAX_RECENT = 10  # the latest fired runs `describe` shows
MAX_CHANGES = 16  # change requests waiting for the owner's answer
# Change requests past MAX_CHANGES kept without their fields (OVERFLOWED), each answered with
# a refusal to send it again: a burst's callers hear why, where they waited 30 s for nothing.
# Past both, a request is ignored (its caller's wait ends in ResultTimeout).
MAX_OVERFLOW = 240
OVERFLOWED = ""  # the body of a change kept past MAX_CHANGES (a kept one's is a JSON object)
MAX_RANGES = 16  # ranges of the watermark kept

OVERLAPS = ("skip", "buffer_one", "allow_all", "cancel_other")
ACTIONS = ("create", "update", "pause", "unpause", "delete", "trigger", "backfill")


class ScheduleSpec(_Frozen, frozen=True, array_like=True):
    """What a schedule fires and when, as created or last updated."""

    flow: str
    payload_json: str = "null"
    cron: str | None = None
    every_ms: int | None = None
    offset_ms: int = 0
    timezone: str = "UTC"
    overlap: str = "skip"
    catchup_window_ms: int = 60_000
    jitter_ms: int = 0
    run_timeout_ms: int | None = None
    ceiling: tuple[str, ...] | None = None


class Fired(_Frozen, frozen=True, array_like=True):
    """A run the schedule fired: its id, nominal instant, why, and how it ended (None: not
    settled yet), as its settlement came back; readers show its run's status now
    (`with_run_statuses`)."""

    run_id: str
    nominal_ms: int
    reason: str = "schedule"
    status: str | None = None


class Change(_Frozen, frozen=True, array_like=True):
    """A change request applied and not answered yet (the owner answers each once)."""

    request_id: str
    action: str
    offset: int
    body_json: str  # the request's fields (projections.schedules.change_body), or OVERFLOWED


class ScheduleState(_Frozen, frozen=True, array_like=True):
    schedule_id: str
    partition: int
    created_ms: int = 0
    updated_ms: int = 0
    exists: bool = False  # created and not deleted (a request may come first)
    spec: ScheduleSpec | None = None
    paused: bool = False
    note: str | None = None
    next_fire_ms: int | None = None  # the owner's computation, journaled (None: paused)
    # The watermark: the ranges of nominal instants the schedule fired or skipped itself,
    # oldest first (MAX_RANGES at most; a pause ends one): a backfill fires none of them
    # again, whether or not their runs are still kept.
    handled: tuple[tuple[int, int], ...] = ()
    range_open: bool = False  # the next own instant extends the last range
    fires: int = 0
    skipped: int = 0
    running: tuple[str, ...] = ()  # fired runs not settled yet, MAX_RUNNING at most
    buffered_ms: int | None = None  # buffer_one: the one fire waiting for the running run
    recent: tuple[Fired, ...] = ()  # MAX_RECENT at most, newest last
    changes: tuple[Change, ...] = ()  # MAX_CHANGES at most, and MAX_OVERFLOW overflowed
    # The instant an update kept past its nominal time (it waited out its jitter then): it
    # fires however its due time under the new spec stands to the catch-up window.
    kept_ms: int | None = None
    kept_at_ms: int | None = None  # when the update that kept it was made (its log time)
    # The ranges of nominal instants backfills fired (MAX_RANGES at most, the oldest two
    # merged past it, as `handled`'s): a backfill fires none of them again. Each backfill
    # request's fires make one range (between two of its instants lie only instants fired
    # already); `backfill_open`: the last range is the current request's.
    backfilled: tuple[tuple[int, int], ...] = ()
    backfill_open: bool = False

    @property
    def due_ms(self) -> int | None:
        """When the owner must act on it next: its next fire (and its jitter), unless
        paused or deleted."""
        if not self.exists or self.paused or self.next_fire_ms is None:
            return None
        return self.due_of(self.next_fire_ms)

    def due_of(self, nominal_ms: int) -> int:
        """When the instant `nominal_ms` falls due: plus its jitter (deterministic)."""
        jitter = 0 if self.spec is None else self.spec.jitter_ms
        return nominal_ms + jitter_ms(self.schedule_id, nominal_ms, jitter)

    @property
    def idle_since_ms(self) -> int | None:
        """Since when it is only a leftover (deleted, or never created, with no change
        waiting for an answer): retention drops it that long after (projections.expiry)."""
        return None if self.exists or self.changes else self.updated_ms


def with_run_statuses(schedule: ScheduleState,
                      status_of: Callable[[str], str | None]) -> ScheduleState:
    """The schedule as a reader shows it: each recent run's status as its run stands now
    (`status_of`: its lineage's latest round's status; None: no such run). A run gone after
    its settlement came back is `expired` (retention removed it); one gone before is
    `pending` (its create still on its way through the owner's outbox); a rejected one
    never had a state. The Client, the TestEnvironment, the CLI and the UI all show it so:
    the Client and the environment said `completed` for a run the CLI said `expired`."""
    def now(fired: Fired) -> Fired:
        if fired.status == "rejected":
            return fired
        status = status_of(fired.run_id)
        if status is None:
            status = "pending" if fired.status is None else "expired"
        return fired if status == fired.status else replace(fired, status=status)
    return replace(schedule, recent=tuple(now(fired) for fired in schedule.recent))
