"""The waiting calls of a flow context: timers, signals, child runs, and cancellation.

A wait takes a journal position like a step. When its outcome is journaled, a replay
returns it; when it can be satisfied at once (a buffered signal, a settled child, a timer
already due) it is journaled as satisfied and the run keeps running; otherwise the run
suspends (`run.suspended`) and continues when the owner journals its outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import numbers
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from runstream.engine.config import Duration, as_duration, millis
from runstream.engine.errors import (
    Cancelled,
    ChildCancelled,
    ChildFailed,
    FlowCycleDetected,
    SignalRefused,
    SpawnRefused,
    WaitTimeout,
)
from runstream.engine.flow.branch_cancel import BranchCancel
from runstream.engine.flow.definition import Flow, dump_json
from runstream.engine.flow.port import JournalPort
from runstream.engine.journal import EncodeError
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import (
    PayloadTooLarge,
    RunIdInvalid,
    check_name,
    check_payload,
    check_run_id,
)
from runstream.engine.journal.records import is_round, lineage_of
from runstream.engine.journal.timetext import epoch_ms
from runstream.engine.observability.tracing import carrier
from runstream.projections.capabilities import narrow
from runstream.projections.sending import RESULT_UNDELIVERABLE
from runstream.projections.state import (
    MAX_DEPTH,
    MAX_OPEN_CHILD_ID_BYTES,
    MAX_OPEN_CHILDREN,
    ChildLink,
    JournalEntry,
    RunState,
    Signal,
    Wait,
    came_by,
)
from runstream.projections.step_entries import timed_out_message
from runstream.projections.transitions import CANCEL_DELIVERED, WAIT_TIMEOUT, wait_entry_name
from runstream.projections.updates import UPDATE_SIGNAL_PREFIX
from runstream.projections.wakes import CHILD_CANCELLED, cancel_wake_reason, child_wake


class WaitingCalls:
    """Mixed into FlowContext, which provides the journal position counter and the port."""

    run_id: str
    _incarnation_id: str  # the run id with its incarnation: what default child ids extend
    _ancestors: tuple[str, ...]
    _ceiling: tuple[str, ...] | None
    _entries: dict[int, JournalEntry]
    _port: JournalPort
    _spawns: int
    _open_child_bytes: int  # the open children's ids, MAX_OPEN_CHILD_ID_BYTES at most
    _settled_children: set[str]  # those whose outcome the handler awaited
    _taken: set[str]
    spawned: list[ChildLink]
    cancel_delivered: bool
    _cancel_delivered_at: int | None
    _loaders_by_child: dict[str, Callable[[str], Any]]
    _steps_running: int
    _steps_ended: asyncio.Event
    _branch_cancel: BranchCancel  # (the branches a delivered cancel reaches)

    def _next_position(self, name: str, kind: str) -> int:
        raise NotImplementedError

    @property
    def ceiling(self) -> tuple[str, ...] | None:
        """The capabilities this run's steps (and the children it spawns) may use: None, any."""
        return self._ceiling

    async def sleep(self, duration: Duration) -> None:
        """Wait durably for `duration` (seconds, a timedelta): a timer wakes the run."""
        millis = _millis(duration)
        await self._timer(lambda now: now + millis)

    async def sleep_until(self, when: datetime) -> None:
        """Wait durably until `when` (a naive datetime is UTC); a past instant returns at once."""
        instant = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
        due = epoch_ms(instant)
        await self._timer(lambda _now: due)

    async def _timer(self, due_of: Callable[[int], int]) -> None:
        position = self._next_position("sleep", "sleep")
        entry = self._entries.get(position)
        if entry is not None and entry.status == "completed":
            return
        self._check_cancel(position, "sleep")
        now = self._port.now_ms()
        due = entry.due_ms if entry is not None and entry.due_ms is not None else due_of(now)
        if due <= now:
            self._port.ensure_active()
            self._port.send(ev.StepCompleted, position=position, name="sleep", kind="sleep",
                            result_json="null", attempt=1)
            return
        await self._wait(Wait(kind="timer", position=position, due_ms=due))

    async def wait_for(self, name: str, *, timeout: Duration | None = None) -> Any:
        """The payload of the next signal `name` sent to this run (one per wait, in the order
        they arrived). Raises WaitTimeout when `timeout` passes first (or an operator ends
        the wait: `client.resume`); NameInvalid for a name no client can send."""
        if not name.startswith(UPDATE_SIGNAL_PREFIX):  # (an update's own wait: its name)
            check_name("signal", name)
        _checked(timeout)
        position = self._next_position(name, "wait")
        entry = self._entries.get(position)
        if entry is not None and entry.status in ("completed", "failed"):
            return self._outcome(entry)
        self._check_cancel(position, name)
        signal = self._take_signal(name, None if entry is None else entry.due_ms)
        if signal is not None:
            self._resumed_inline(position, "event", name, signal_request_id=signal.request_id,
                                 result_json=signal.payload_json)
            return json.loads(signal.payload_json)
        due = self._due_unless_timed_out(position, "timer", name, "wait", entry, timeout)
        return await self._wait(Wait(kind="event", position=position, due_ms=due,
                                     event_name=name))

    def _take_signal(self, name: str, due_ms: int | None = None) -> Signal | None:
        for signal in self._port.run_state().signals:  # (by the wait's due time: came_by)
            if (signal.name == name and signal.request_id not in self._taken
                    and came_by(signal, due_ms)):
                self._taken.add(signal.request_id)
                return signal
        return None

    def _due_unless_timed_out(self, position: int, reason: str, name: str, kind: str,
                              entry: JournalEntry | None,
                              timeout: Duration | None) -> int | None:
        """When the wait at `position` times out (its entry's time on replay, else now plus
        `timeout`; None: never). A time already past ends the wait at once, journaled as a
        timeout (`reason` the wake's, `kind` the entry's), and raises WaitTimeout."""
        now = self._port.now_ms()
        due = entry.due_ms if entry is not None else (
            None if timeout is None else now + _millis(timeout))
        if due is not None and due <= now:
            message = timed_out_message(kind, name)
            self._resumed_inline(position, reason, name, error_type=WAIT_TIMEOUT,
                                 error_message=message)
            raise WaitTimeout(name, message)
        return due

    def _resumed_inline(self, position: int, reason: str, name: str, **outcome: Any) -> None:
        """A wait satisfied without suspending (a buffered signal, a settled child, a timeout
        already past): journaled like a wake, and the run keeps running."""
        self._port.ensure_active()
        self._port.send(ev.RunResumed, reason=reason, position=position, name=name,
                        detail="satisfied at once", **outcome)

    async def spawn(
        self, flow: Flow[Any, Any] | str, payload: Any = None, *, run_id: str | None = None,
        detach: bool = False,
    ) -> ChildRun:
        """Start a child run of `flow` (its own lineage, maybe in another partition).

        Its run id defaults to one derived from this run and the spawn's journal position.
        When this run ends, a linked child still running is cancelled; a detached one keeps
        running. Await `child.result()` for its outcome."""
        name = flow.name if isinstance(flow, Flow) else flow
        loader = flow.load_result if isinstance(flow, Flow) else None
        position = self._next_position(name, "spawn")
        entry = self._entries.get(position)
        self._spawns += 1
        if entry is not None and entry.status == "completed":
            spawned_id = str(json.loads(entry.result_json or "null"))
            self._open_child_bytes += len(spawned_id.encode())  # (as when it was spawned)
            return ChildRun(self, spawned_id, position, loader)
        self._check_cancel(position, name)
        child_id = run_id or f"{self._incarnation_id}.{position}"
        self._check_spawn(child_id)
        payload_json = flow.dump_payload(payload) if isinstance(flow, Flow) else dump_json(payload)
        try:  # the limit a client's create is held to (its create request carries it)
            check_payload(f"the payload of child {child_id!r}", payload_json)
        except PayloadTooLarge as exc:
            raise SpawnRefused(f"run {self.run_id} cannot spawn {child_id}: {exc}") from exc
        # (spawned once a cancel is under way: linked whatever it asked, cancelled with it)
        linked = not detach or self.cancel_delivered or (
            self._port.run_state().cancel_requested is not None)
        self._port.ensure_active()
        caps = flow.capabilities if isinstance(flow, Flow) else None
        ceiling = narrow(self._ceiling, caps)  # a child's ceiling is at most its parent's
        try:
            self._port.send(ev.ChildSpawned, child_run_id=child_id, child_lineage_id=child_id,
                            flow=name, position=position, payload_json=payload_json,
                            parent_exit_policy="cancel" if linked else "detach",
                            ceiling=None if ceiling is None else list(ceiling),
                            trace_context=carrier())
        except EncodeError as exc:  # over the send limit: nothing journaled, a refused spawn
            raise SpawnRefused(f"run {self.run_id} cannot spawn {child_id}: its spawn cannot "
                               f"be journaled: {exc}") from exc
        self.spawned.append(ChildLink(run_id=child_id, lineage_id=child_id, position=position,
                                      detached=not linked))
        return ChildRun(self, child_id, position, loader)

    def _check_spawn(self, child_id: str) -> None:
        path = [*self._ancestors, self.run_id]
        # (an ancestor's lineage id names it, or its later round, too: no "run exists")
        named = [run_id for run_id in path if child_id in (run_id, lineage_of(run_id))]
        if named:
            raise FlowCycleDetected([*path[path.index(named[0]):], child_id])
        try:  # an id no client or CLI could address is refused, as a client's create is
            check_run_id(child_id)
        except RunIdInvalid as exc:
            raise SpawnRefused(f"run {self.run_id} cannot spawn a child: {exc}") from exc
        if is_round(child_id):  # its records would be keyed by the lineage it names
            raise SpawnRefused(f"run {self.run_id} cannot spawn {child_id}: an id ending in "
                               f"'~<n>' names round n of a lineage, not a child")
        if len(path) >= MAX_DEPTH:
            raise SpawnRefused(f"run {self.run_id} is {len(path)} levels deep; a tree of runs "
                               f"goes {MAX_DEPTH} deep at most")
        if self._spawns > MAX_OPEN_CHILDREN:
            raise SpawnRefused(f"run {self.run_id} has {MAX_OPEN_CHILDREN} children open "
                               f"(spawned, their results not awaited yet, with those still "
                               f"open that earlier rounds handed down), the most one run may")
        self._open_child_bytes += len(child_id.encode())
        if self._open_child_bytes > MAX_OPEN_CHILD_ID_BYTES:
            raise SpawnRefused(f"run {self.run_id} cannot spawn {child_id}: its open "
                               f"children's ids would pass {MAX_OPEN_CHILD_ID_BYTES} bytes, "
                               f"the most its exit can list")

    async def _child_result(self, child_id: str, spawn_position: int,
                            timeout: Duration | None = None) -> Any:
        _checked(timeout)
        position = self._next_position(child_id, "child")
        entry = self._entries.get(position)
        spawn = self._port.entry(spawn_position)
        self._typed_as_settled(child_id, spawn)
        if entry is not None and entry.status in ("completed", "failed"):
            return self._outcome(entry)
        self._check_cancel(position, child_id)
        if spawn is not None and spawn.child_status is not None:
            wake = child_wake(position, child_id, spawn)
            self._resumed_inline(position, "child", child_id, result_json=wake.result_json,
                                 error_type=wake.error_type, error_message=wake.error_message)
            return self._outcome(JournalEntry(
                position=position, name=child_id, kind="child",
                status="failed" if wake.error_type else "completed",
                result_json=wake.result_json, error_type=wake.error_type,
                error_message=wake.error_message))
        due = self._due_unless_timed_out(position, "child", child_id, "child", entry, timeout)
        wait = Wait(kind="child", position=position, child_run_id=child_id,
                    child_position=spawn_position, due_ms=due)
        outcome = await self._suspended_until(wait, child_id, _has_outcome)
        self._typed_as_settled(child_id, self._port.entry(spawn_position))
        return self._outcome(outcome)

    def _typed_as_settled(self, child_id: str, spawn: JournalEntry | None) -> None:
        """A child spawned as a Flow that handed off to another flow: its result loads as
        that flow's (its final round's, which its wake names), as the client's
        result(follow=True) does; as the spawned flow's when this worker does not register
        it. (The spawned flow's type failed the parent for good, replay after replay.)"""
        if (spawn is None or spawn.child_flow in (None, spawn.name)
                or child_id not in self._loaders_by_child):
            return
        loader = self._port.result_loader(spawn.child_flow or "")
        if loader is not None:
            self._loaders_by_child[child_id] = loader

    async def _wait(self, wait: Wait) -> Any:
        """Suspend until the wait ends; with a sticky handler, go on with its outcome."""
        outcome = await self._suspended_until(wait, wait_entry_name(wait), _has_outcome)
        return self._outcome(outcome)

    async def _suspended_until(self, wait: Wait, name: str,
                               ended: Callable[[JournalEntry], bool]) -> JournalEntry:
        """Suspend (the handler is dropped and replayed when woken, unless a sticky cache
        keeps it) until the entry at the wait's position says it `ended`; that entry. Steps
        running in other branches end first (one begun during the barrier too), their
        outcomes journaled: dropped with the handler, they ran again on replay."""
        while True:
            while self._steps_running:
                self._steps_ended.clear()
                await self._steps_ended.wait()
            self._branch_cancel.before_suspending()  # (a branch the cancel did not reach)
            await self._port.barrier()
            if self._steps_running:
                continue
            outcome = await self._port.suspend(wait)
            if outcome is not None and outcome.error_type == CANCEL_DELIVERED:
                self._replay_cancel(outcome)  # the owner ended the wait for a cancel
            if outcome is not None and ended(outcome):
                return outcome
            # (woken for a cancel by an older wake, raised; anything else: wait again)
            self._check_cancel(wait.position, name)

    def _outcome(self, entry: JournalEntry) -> Any:
        """What a finished wait returns or raises, from its journal entry."""
        if entry.kind == "sleep":
            return None
        if entry.kind == "child" and entry.error_type != WAIT_TIMEOUT:
            self._child_settled(entry.name)
        if entry.status == "completed":
            loader = self._loaders_by_child.get(entry.name) if entry.kind == "child" else None
            text = entry.result_json or "null"
            return loader(text) if loader is not None else json.loads(text)
        message = entry.error_message or ""
        if entry.kind == "wait" and entry.error_type == RESULT_UNDELIVERABLE:
            # (the signal's payload fit its own record, not the resumption: projections.sending)
            raise SignalRefused(self._port.run_state().run_id, entry.name,
                                message.partition(": ")[2] or message)
        if entry.kind == "wait" or entry.error_type == WAIT_TIMEOUT:
            raise WaitTimeout(entry.name, message)
        if entry.error_type == CHILD_CANCELLED:
            raise ChildCancelled(entry.name, message)
        error_type, _, detail = message.partition(": ")
        raise ChildFailed(entry.name, error_type or "Error", detail)

    def _child_settled(self, child_id: str) -> None:
        """The handler has the child's outcome: it no longer counts against the spawn limit.
        Only an outcome the handler awaited counts, never one the projection holds: the
        journal gives it at the same point on every replay, so a spawn is refused (or not)
        at the same call each time. (A child that settled unawaited still counts.)"""
        if child_id not in self._settled_children:
            self._settled_children.add(child_id)
            self._spawns -= 1
            self._open_child_bytes -= len(child_id.encode())

    def _check_cancel(self, position: int | None, name: str) -> None:
        """The first durable call after a cancel request (one not replayed from the journal)
        raises Cancelled, and journals that it did at its position (a replay raises it
        there, and the owner knows not to end a cleanup wait for the same cancel); calls
        after it, in `finally` blocks, are journaled as cleanup."""
        if self.cancel_delivered or self._cancel_delivered_at is not None:
            return
        run = self._port.run_state()
        reason = run.cancel_requested
        if reason is None:
            return
        self.cancel_delivered = True
        self._branch_cancel.delivered(reason)
        if position is not None and run.cancel_delivered_at is None:
            # The cascade first (projections.owner._wake says why).
            self._cascade(run, reason)
            self._port.send(ev.RunResumed, reason=cancel_wake_reason(run), position=position,
                            name=name, error_type=CANCEL_DELIVERED, error_message=reason,
                            detail="the cancel reached the handler here")
        raise Cancelled(reason)

    def _cascade(self, run: RunState, reason: str) -> None:
        """The cancel reached the handler: its linked children are cancelled now, not at its
        exit (a cleanup that waited for one waited for ever: the cancel reached the child
        only once the parent ended). Its exit's policy names them again: the same cancel
        request ids, taken once."""
        open_links = open_children(run.children, self.spawned, self._port.entry)
        linked = [link.run_id for link in open_links if not link.detached]
        if linked:
            self._port.send(ev.ChildPolicyApplied, cancelled=linked, detached=[],
                            reason=f"cancelled ({reason})")

    def _replay_cancel(self, entry: JournalEntry) -> None:
        """The journal says the cancel reached the handler at `entry`: raise it again here
        (once per execution; cleanup after it runs normally)."""
        self.cancel_delivered = True
        self._cancel_delivered_at = entry.position
        self._branch_cancel.delivered(reason := entry.error_message or "cancelled")
        raise Cancelled(reason)


class ChildRun:
    """A child run spawned by `ctx.spawn`: its id, and its outcome once it settles."""

    def __init__(self, ctx: WaitingCalls, run_id: str, position: int,
                 loader: Callable[[str], Any] | None) -> None:
        self.run_id = run_id
        self._ctx = ctx
        self._position = position
        if loader is not None:
            ctx._loaders_by_child[run_id] = loader

    async def result(self, *, timeout: Duration | None = None) -> Any:
        """The child's result; suspends the parent until the child settles. Raises
        ChildFailed or ChildCancelled with the child's error, or WaitTimeout when `timeout`
        (seconds or a timedelta, a durable timer) passes first: the child keeps running
        (cancel it, or ask for its result again)."""
        return await self._ctx._child_result(self.run_id, self._position, timeout)

    def __repr__(self) -> str:
        return f"ChildRun({self.run_id!r})"


def _has_outcome(entry: JournalEntry) -> bool:
    return entry.status in ("completed", "failed")


def _millis(duration: Duration) -> int:
    """A wait's duration in ms (0 at least): seconds (any real number, or text float()
    reads, as before), a timedelta or text like 5m; DurationInvalid (an InvalidInput and a
    ValueError) for anything else, NaN and the infinities included (a bare ValueError or
    OverflowError failed the run)."""
    given: Any = duration
    if isinstance(given, numbers.Number) and not isinstance(given, bool | complex):
        given = float(given)  # type: ignore[arg-type]  # (a Decimal, a Fraction)
    elif isinstance(given, str):
        with contextlib.suppress(ValueError):
            given = float(given)  # ("1e3", "+5", "-1")
    return max(0, millis(as_duration(given)))


def _checked(timeout: Duration | None) -> None:
    """A wait's timeout, checked before the journal is read: a handler that caught the
    error got the wait's outcome at the same call on replay."""
    if timeout is not None:
        _millis(timeout)


def handed_down(children: Iterable[ChildLink],
                entries: Mapping[int, JournalEntry]) -> list[ChildLink]:
    """The open children an earlier round handed down: links no spawn of this run's journal
    made. (A handoff carries them, and a round that spawned MAX_OPEN_CHILDREN more each
    time grew its lineage's list past what its exit's child.policy-applied can hold: the
    parent then never settled.)"""
    def ours(link: ChildLink) -> bool:
        entry = entries.get(link.position)
        return (entry is not None and entry.kind == "spawn"
                and json.loads(entry.result_json or "null") == link.run_id)
    return [link for link in children if not ours(link)]


def open_children(children: Iterable[ChildLink], spawned: Iterable[ChildLink],
                  entry: Callable[[int], JournalEntry | None]) -> list[ChildLink]:
    """Children spawned and not settled: the projection's `children`, plus the `spawned`
    of this activation the projection has not applied yet (their spawn entries are
    missing, or hold no outcome)."""
    links = {link.run_id: link for link in children}
    for link in spawned:
        if link.run_id not in links:
            spawn = entry(link.position)
            if spawn is None or spawn.child_status is None:
                links[link.run_id] = link
    return list(links.values())
