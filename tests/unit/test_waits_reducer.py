"""Durable waiting, child runs and cancellation in the pure reducer and the owner's pure
decisions (projections.decide). No broker: records come from tests.builders and are folded by
MemoryProjection, whose store keeps the same timer and outbox indexes as RocksDB."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.projections.memory import MemoryProjection
from runstream.projections.requests import describe_refusal
from runstream.projections.state import (
    MAX_SIGNALS,
    ChildLink,
    JournalEntry,
    OutboxItem,
    RunState,
    RunStatus,
    Signal,
    Verdict,
    Wait,
    replace,
)
from runstream.projections.transitions import CANCEL_DELIVERED, WAIT_TIMEOUT
from runstream.projections.values import DueTimer
from runstream.projections.wakes import (
    CHILD_CANCELLED,
    CHILD_FAILED,
    CancelNow,
    ExitPolicy,
    Wake,
    cancel_on_pending,
    decide_waiting,
    exit_policy,
)
from tests.builders import Writer, create, created, request

DUE = 1_800_000_000_000  # a timer's due time (record times come from the builders' clock)


class Log:
    """Records folded in order into partitions 0 and 1, both owned by one writer."""

    def __init__(self, owner: str = "owner") -> None:
        self.projection = MemoryProjection(keep_history=True)
        self.writer = Writer(owner)
        self.offsets = {0: 0, 1: 0}
        for partition in self.offsets:
            self.apply(self.writer.claim(partition), partition)

    def apply(self, record: JournalRecord, partition: int = 0) -> Verdict:
        offset = self.offsets[partition]
        self.offsets[partition] = offset + 1
        return self.projection.apply_record(partition, offset, record)

    def decide(self, cls: type[Any], run_id: str, at: int = 0, *,
               writer: Writer | None = None, **body: Any) -> Verdict:
        """A decision about `run_id` in partition `at` (the owner's unless `writer`)."""
        return self.apply((writer or self.writer).decide(cls, run_id=run_id, **body), at)

    def ask(self, cls: type[Any], run_id: str, request_id: str, at: int = 0,
            **body: Any) -> Verdict:
        return self.apply(request(cls, run_id=run_id, request_id=request_id, **body), at)

    def start(self, run_id: str, partition: int = 0, *, flow: str = "checkout") -> None:
        """Requested, admitted and activated: a running run."""
        offset = self.offsets[partition]
        self.apply(create(run_id, f"create-{run_id}", flow=flow), partition)
        self.apply(created(self.writer, run_id, f"create-{run_id}", request_offset=offset,
                           flow=flow), partition)
        self.decide(ev.RunActivated, run_id, partition, mode="new", activation=1)

    def deliver(self, item: OutboxItem, partition: int) -> Verdict:
        """An outbox item as the owner sends it: its request, with the item's request id."""
        return self.ask(_REQUESTS[item.type], item.run_id, item.request_id, partition,
                        **json.loads(item.body_json))

    def run(self, run_id: str) -> RunState:
        return self.projection.runs[run_id]

    def entry(self, run_id: str, position: int) -> JournalEntry | None:
        return self.projection.store.entry(run_id, position)

    def outbox(self, partition: int = 0) -> list[OutboxItem]:
        return self.projection.store.outbox(partition)

    def timers(self, partition: int = 0) -> list[DueTimer]:
        return self.projection.store.due_timers(partition, 10**15, 100)

    def verdicts(self, run_id: str) -> list[Verdict]:
        return [item.verdict for item in self.projection.history[run_id]]


_REQUESTS: dict[str, type[Any]] = {
    cls.TYPE: cls for cls in (ev.RunCreateRequested, ev.RunWakeRequested, ev.RunCancelRequested)
}


def sleeping(log: Log, run_id: str = "r1", *, due_ms: int = DUE) -> None:
    """A run that did one step and sleeps at position 1 until `due_ms`."""
    log.start(run_id)
    log.decide(ev.StepCompleted, run_id, position=0, name="before", result_json='"x"')
    log.decide(ev.RunSuspended, run_id, reason="timer", position=1, wake_at_ms=due_ms)


def waiting(log: Log, run_id: str = "r1", *, name: str = "approval",
            due_ms: int | None = None, position: int = 0) -> None:
    """A run that waits for signal `name` at `position` (a timeout at `due_ms`)."""
    log.start(run_id)
    log.decide(ev.RunSuspended, run_id, reason="event", position=position, event_name=name,
               wake_at_ms=due_ms)


def signal(log: Log, run_id: str, request_id: str, name: str = "approval",
           payload: Any = None) -> Verdict:
    return log.ask(ev.RunSignalSent, run_id, request_id, name=name,
                   payload_json=json.dumps(payload))


# -- timers ---------------------------------------------------------------------------------


def test_timer_suspension_writes_a_waiting_entry_and_indexes_the_timer() -> None:
    log = Log()
    sleeping(log)
    run = log.run("r1")
    assert (run.status, run.suspended_reason) == (RunStatus.suspended, "timer")
    assert run.wait == Wait(kind="timer", position=1, due_ms=DUE)
    assert run.steps == 2
    assert log.entry("r1", 1) == JournalEntry(position=1, name="sleep", kind="sleep",
                                              status="waiting", due_ms=DUE)
    store = log.projection.store
    assert store.due_timers(0, DUE - 1, 10) == []
    assert store.due_timers(0, DUE, 10) == [DueTimer(DUE, "r1", 1)]
    assert store.next_due_ms(0) == DUE
    assert log.timers(1) == []  # the timer is its run's partition's


def test_timers_come_due_in_due_order_up_to_the_limit() -> None:
    log = Log()
    for i, due in enumerate([DUE + 30, DUE + 10, DUE + 20]):
        sleeping(log, f"r{i}", due_ms=due)
    store = log.projection.store
    assert [t.run_id for t in store.due_timers(0, DUE + 30, 10)] == ["r1", "r2", "r0"]
    assert [t.run_id for t in store.due_timers(0, DUE + 30, 2)] == ["r1", "r2"]
    assert [t.run_id for t in store.due_timers(0, DUE + 15, 10)] == ["r1"]
    assert store.next_due_ms(0) == DUE + 10


def test_timer_fired_completes_the_sleep_and_clears_the_timer() -> None:
    log = Log()
    sleeping(log)
    assert log.decide(ev.TimerFired, "r1", position=1, due_ms=DUE) is Verdict.applied
    run = log.run("r1")
    assert (run.status, run.wait, run.wake_reason) == (RunStatus.pending, None, "timer")
    assert log.entry("r1", 1) == JournalEntry(position=1, name="sleep", kind="sleep",
                                              status="completed", attempts=1,
                                              result_json="null", due_ms=DUE)
    assert log.timers() == [] and log.projection.store.next_due_ms(0) is None


def test_timer_fired_fails_an_event_wait_with_wait_timeout() -> None:
    log = Log()
    waiting(log, due_ms=DUE)
    assert log.entry("r1", 0) == JournalEntry(position=0, name="approval", kind="wait",
                                              status="waiting", due_ms=DUE)
    assert log.timers() == [DueTimer(DUE, "r1", 0)]
    assert log.decide(ev.TimerFired, "r1", position=0, due_ms=DUE) is Verdict.applied
    entry = log.entry("r1", 0)
    assert entry is not None
    assert (entry.kind, entry.status, entry.error_type) == ("wait", "failed", WAIT_TIMEOUT)
    assert "approval" in (entry.error_message or "")
    assert (log.run("r1").status, log.run("r1").wait) == (RunStatus.pending, None)
    assert log.timers() == []


def test_a_signal_before_the_timer_in_the_log_wins_over_the_timeout() -> None:
    """The signal is applied, the owner has not delivered it yet, and the timer fires: the
    log says the signal came first, so the wait gets the signal, not WaitTimeout."""
    log = Log()
    waiting(log, due_ms=DUE)
    log.ask(ev.RunSignalSent, "r1", "s1", name="approval", payload_json='"yes"')
    assert log.decide(ev.TimerFired, "r1", position=0, due_ms=DUE) is Verdict.applied
    entry = log.entry("r1", 0)
    assert entry is not None
    assert (entry.status, entry.result_json, entry.error_type) == ("completed", '"yes"', None)
    run = log.run("r1")
    assert (run.status, run.signals, run.wake_reason) == (RunStatus.pending, (), "event")


def test_a_stale_or_repeated_timer_fired_is_ignored() -> None:
    log = Log()
    sleeping(log)
    before = log.run("r1")
    assert log.decide(ev.TimerFired, "r1", position=1, due_ms=DUE + 1) is Verdict.ignored
    assert log.decide(ev.TimerFired, "r1", position=0, due_ms=DUE) is Verdict.ignored
    assert log.run("r1") == before and log.timers() == [DueTimer(DUE, "r1", 1)]
    fired = log.writer.decide(ev.TimerFired, run_id="r1", position=1, due_ms=DUE)
    assert log.apply(fired) is Verdict.applied
    woken = log.run("r1")
    assert log.apply(fired) is Verdict.duplicate  # the same record again
    # Fired again by a later sweep (a new decision): the wait is over already.
    assert log.decide(ev.TimerFired, "r1", position=1, due_ms=DUE) is Verdict.ignored
    assert log.run("r1") == woken
    slept = log.entry("r1", 1)
    assert slept is not None and slept.status == "completed"


def test_a_timeout_firing_after_the_signal_ended_the_wait_is_ignored() -> None:
    log = Log()
    waiting(log, due_ms=DUE)
    signal(log, "r1", "s1", payload="yes")
    log.decide(ev.RunResumed, "r1", reason="event", position=0, name="approval",
               signal_request_id="s1", result_json='"yes"')
    assert log.timers() == []  # the wake took the timeout out of the index
    assert log.decide(ev.TimerFired, "r1", position=0, due_ms=DUE) is Verdict.ignored
    entry = log.entry("r1", 0)
    assert entry is not None and (entry.status, entry.result_json) == ("completed", '"yes"')


def test_a_suspension_at_a_wait_that_is_over_is_stale() -> None:
    log = Log()
    sleeping(log)
    log.decide(ev.TimerFired, "r1", position=1, due_ms=DUE)
    log.decide(ev.RunActivated, "r1", mode="resumed", activation=2)
    running = log.run("r1")
    assert log.decide(ev.RunSuspended, "r1", reason="timer", position=1,
                      wake_at_ms=DUE) is Verdict.ignored
    assert log.run("r1") == running and log.timers() == []


def test_a_quarantine_suspension_has_no_entry_and_no_timer() -> None:
    log = Log()
    log.start("r1")
    log.decide(ev.RunSuspended, "r1", reason="quarantine", detail="irreversible step")
    run = log.run("r1")
    assert (run.status, run.wait) == (RunStatus.suspended, Wait(kind="quarantine"))
    assert run.steps == 0 and log.timers() == []


# -- signals --------------------------------------------------------------------------------


def test_signals_buffer_in_arrival_order_and_the_65th_is_refused() -> None:
    log = Log()
    log.apply(create("r1", "q1"))  # requested, not even admitted yet: signals wait for it
    verdicts = [signal(log, "r1", f"s{i}", name=f"n{i % 3}", payload=i)
                for i in range(MAX_SIGNALS)]
    assert set(verdicts) == {Verdict.applied}
    run = log.run("r1")
    assert [s.request_id for s in run.signals] == [f"s{i}" for i in range(MAX_SIGNALS)]
    assert [json.loads(s.payload_json) for s in run.signals] == list(range(MAX_SIGNALS))
    assert signal(log, "r1", "one-too-many") is Verdict.refused
    assert log.run("r1").signals == run.signals
    assert "64" in describe_refusal(log.run("r1"), request(
        ev.RunSignalSent, run_id="r1", request_id="x", name="n"))
    assert signal(log, "r1", "s3") is Verdict.duplicate  # a request id seen before


def test_a_refused_signal_may_be_sent_again_once_there_is_room() -> None:
    log = Log()
    log.start("r1")
    for i in range(MAX_SIGNALS):
        signal(log, "r1", f"s{i}", name="item")
    assert signal(log, "r1", "late", name="item") is Verdict.refused
    log.decide(ev.RunResumed, "r1", reason="event", position=0, name="item",
               signal_request_id="s0", result_json="0")
    assert signal(log, "r1", "late", name="item") is Verdict.applied  # not remembered
    assert log.run("r1").signals[-1].request_id == "late"


def test_resumed_with_a_signal_request_id_consumes_exactly_that_signal() -> None:
    log = Log()
    waiting(log, due_ms=DUE)
    signal(log, "r1", "s1", name="item", payload=1)
    signal(log, "r1", "s2", payload={"by": "ops"})
    signal(log, "r1", "s3", payload={"by": "boss"})
    verdict = log.decide(ev.RunResumed, "r1", reason="event", position=0, name="approval",
                         signal_request_id="s2", result_json='{"by": "ops"}')
    assert verdict is Verdict.applied
    run = log.run("r1")
    assert [s.request_id for s in run.signals] == ["s1", "s3"]
    assert (run.status, run.wait, run.wake_reason) == (RunStatus.pending, None, "event")
    assert log.entry("r1", 0) == JournalEntry(
        position=0, name="approval", kind="wait", status="completed", attempts=1,
        result_json='{"by": "ops"}', due_ms=DUE)
    assert log.timers() == []


def test_resumed_for_another_position_than_the_wait_is_ignored() -> None:
    log = Log()
    waiting(log, position=2)
    signal(log, "r1", "s1")
    before = log.run("r1")
    assert log.decide(ev.RunResumed, "r1", reason="event", position=1, name="approval",
                      signal_request_id="s1", result_json="null") is Verdict.ignored
    assert log.run("r1") == before and log.entry("r1", 1) is None


def test_an_inline_resumed_on_a_running_run_writes_the_entry_and_keeps_it_running() -> None:
    log = Log()
    log.start("r1")
    signal(log, "r1", "s1", name="item", payload="one")
    signal(log, "r1", "s2", name="item", payload="two")
    assert log.decide(ev.RunResumed, "r1", reason="event", position=0, name="item",
                      signal_request_id="s1", result_json='"one"') is Verdict.applied
    # A wait whose timeout has passed already, and a child that had settled already.
    log.decide(ev.RunResumed, "r1", reason="timer", position=1, name="approval",
               error_type=WAIT_TIMEOUT, error_message="too late")
    log.decide(ev.RunResumed, "r1", reason="child", position=2, name="r1.9",
               result_json="7")
    run = log.run("r1")
    assert (run.status, run.wait, run.wake_reason) == (RunStatus.running, None, None)
    assert [s.request_id for s in run.signals] == ["s2"]
    assert run.steps == 3
    assert [(e.kind, e.name, e.status, e.result_json, e.error_type)
            for e in log.projection.journal("r1")] == [
        ("wait", "item", "completed", '"one"', None),
        ("wait", "approval", "failed", None, WAIT_TIMEOUT),
        ("child", "r1.9", "completed", "7", None),
    ]
    # The same position again (a replay that re-sent it): the wait is over.
    assert log.decide(ev.RunResumed, "r1", reason="event", position=0, name="item",
                      signal_request_id="s2", result_json='"two"') is Verdict.ignored
    assert [s.request_id for s in log.run("r1").signals] == ["s2"]


def test_a_resumed_for_a_pending_run_is_ignored() -> None:
    log = Log()
    sleeping(log)
    log.decide(ev.TimerFired, "r1", position=1, due_ms=DUE)
    assert log.decide(ev.RunResumed, "r1", reason="event", position=2, name="x",
                      result_json="1") is Verdict.ignored
    assert log.entry("r1", 2) is None


# -- cancel and operator resume requests ------------------------------------------------------


def test_a_cancel_request_is_taken_once_and_refused_on_an_ended_run() -> None:
    log = Log()
    log.start("r1")
    assert log.ask(ev.RunCancelRequested, "r1", "c1", reason="stop",
                   requested_by="ops") is Verdict.applied
    assert log.ask(ev.RunCancelRequested, "r1", "c2", reason="other",
                   requested_by="bob") is Verdict.ignored
    assert log.ask(ev.RunCancelRequested, "r1", "c1", reason="stop") is Verdict.duplicate
    run = log.run("r1")
    assert (run.cancel_requested, run.cancel_requested_by) == ("stop", "ops")
    log.start("r2")
    log.ask(ev.RunCancelRequested, "r2", "c3")
    assert log.run("r2").cancel_requested == "cancelled"  # no reason given
    log.start("r3")
    log.decide(ev.RunCompleted, "r3", result_json="1")
    assert log.ask(ev.RunCancelRequested, "r3", "c4", reason="late") is Verdict.refused
    assert log.run("r3").cancel_requested is None


def test_a_cancel_ends_a_sleeping_run_s_wait_cancelled_once_and_a_cleanup_wait_waits() -> None:
    log = Log()
    sleeping(log)
    log.ask(ev.RunCancelRequested, "r1", "c1", reason="stop", requested_by="ops")
    assert log.run("r1").status is RunStatus.suspended  # the owner decides the wake
    action = decide_waiting(log.run("r1"), None)
    assert isinstance(action, Wake) and action.position == 1
    assert (action.error_type, action.error_message) == (CANCEL_DELIVERED, "stop")
    assert log.decide(ev.RunResumed, "r1", reason=action.reason, position=1, name=action.name,
                      error_type=action.error_type,
                      error_message=action.error_message) is Verdict.applied
    run = log.run("r1")
    assert (run.status, run.wait, run.wake_reason) == (RunStatus.pending, None, action.reason)
    assert run.cancel_delivered_at == 1
    assert log.timers() == []
    sleep = log.entry("r1", 1)
    assert sleep is not None and (sleep.status, sleep.error_type) == ("failed", "Cancelled")
    # The same wake again finds nothing to end.
    assert log.decide(ev.RunResumed, "r1", reason=action.reason, position=1,
                      error_type=CANCEL_DELIVERED, error_message="stop") is Verdict.ignored
    # The handler's finally sleeps again: that wait is not ended for the same cancel (it
    # was: suspended, resumed and activated again without end, issue 16 item 3).
    log.decide(ev.RunActivated, "r1", mode="resumed", activation=2)
    log.decide(ev.RunSuspended, "r1", reason="timer", position=2, wake_at_ms=DUE)
    assert decide_waiting(log.run("r1"), None) is None
    assert [t.position for t in log.timers()] == [2]


def test_an_operator_resume_is_refused_unless_suspended_on_a_timer_or_an_event() -> None:
    log = Log()
    log.start("running")
    sleeping(log, "timer")
    waiting(log, "event")
    log.start("child")
    log.decide(ev.RunSuspended, "child", reason="child", position=1, child_run_id="child.0",
               child_position=0)
    log.start("quarantine")
    log.decide(ev.RunSuspended, "quarantine", reason="quarantine")
    log.start("ended")
    log.decide(ev.RunCompleted, "ended", result_json="1")
    answers = {run_id: log.ask(ev.RunResumeRequested, run_id, f"resume-{run_id}",
                               operator="ops", action="wake")
               for run_id in ("running", "timer", "event", "child", "quarantine", "ended")}
    assert answers == {"running": Verdict.refused, "timer": Verdict.applied,
                       "event": Verdict.applied, "child": Verdict.refused,
                       "quarantine": Verdict.refused, "ended": Verdict.refused}
    assert {run_id: run.resume_requested for run_id, run in log.projection.runs.items()} == {
        "running": False, "timer": True, "event": True, "child": False, "quarantine": False,
        "ended": False}
    resume = request(ev.RunResumeRequested, run_id="child", request_id="x", operator="ops")
    assert "child run child.0" in describe_refusal(log.run("child"), resume)
    # The wake that ends the wait forgets the request.
    log.decide(ev.RunResumed, "timer", reason="operator", position=1, name="sleep",
               result_json="null")
    run = log.run("timer")
    assert (run.resume_requested, run.wake_reason, run.status) == (
        False, "operator", RunStatus.pending)


# -- children ----------------------------------------------------------------------------------


def spawn(log: Log, parent: str, position: int, child: str, *, detach: bool = False,
          payload: Any = None, flow: str = "child") -> Verdict:
    return log.decide(ev.ChildSpawned, parent, child_run_id=child, child_lineage_id=child,
                      flow=flow, position=position, payload_json=json.dumps(payload),
                      parent_exit_policy="detach" if detach else "cancel")


def admit(log: Log, item: OutboxItem, at: int = 1) -> None:
    """A spawn's create request delivered, then admitted and activated as the worker does
    (its run.created names the parent, copied from the request)."""
    log.deliver(item, at)
    body = json.loads(item.body_json)
    log.decide(ev.RunCreated, item.run_id, at, request_id=item.request_id, flow=body["flow"],
               payload_json=body["payload_json"], request_offset=log.offsets[at] - 1,
               parent_run_id=body["parent_run_id"])
    log.decide(ev.RunActivated, item.run_id, at, mode="new", activation=1)


def test_child_spawned_writes_the_spawn_links_the_child_and_requests_its_creation() -> None:
    log = Log()
    log.start("p", flow="parent")
    assert spawn(log, "p", 0, "p.0", payload={"value": 1}) is Verdict.applied
    assert spawn(log, "p", 1, "p.1", detach=True) is Verdict.applied
    run = log.run("p")
    assert run.children == (ChildLink("p.0", "p.0", 0), ChildLink("p.1", "p.1", 1, True))
    assert log.entry("p", 0) == JournalEntry(position=0, name="child", kind="spawn",
                                             status="completed", attempts=1,
                                             result_json='"p.0"')
    first, second = log.outbox(0)
    assert (first.request_id, first.type, first.run_id, first.lineage_id) == (
        "spawn/p/0", ev.RunCreateRequested.TYPE, "p.0", "p.0")
    assert json.loads(first.body_json) == {
        "flow": "child", "payload_json": '{"value": 1}', "parent_run_id": "p",
        "parent_lineage_id": "p", "parent_exit_policy": "cancel", "ancestors": ["p"],
        "parent_position": 0, "ceiling": None, "trace_context": {}}
    assert second.request_id == "spawn/p/1"
    assert json.loads(second.body_json)["parent_exit_policy"] == "detach"
    # The same spawn decided again (a new decision at a position taken): nothing changes.
    assert spawn(log, "p", 0, "p.0") is Verdict.ignored
    assert log.run("p").children == run.children and len(log.outbox(0)) == 2


def test_the_create_request_from_the_outbox_places_the_child_in_its_tree() -> None:
    log = Log()
    log.start("p", flow="parent")
    spawn(log, "p", 0, "p.0")
    spawn(log, "p", 1, "p.1", detach=True)
    for item in log.outbox(0):
        assert log.deliver(item, 1) is Verdict.applied
        assert log.deliver(item, 1) is Verdict.duplicate  # re-sent on a claim
    child, detached = log.run("p.0"), log.run("p.1")
    assert (child.partition, child.parent_run_id, child.parent_lineage_id,
            child.parent_position, child.ancestors, child.detached) == (
        1, "p", "p", 0, ("p",), False)
    assert (detached.parent_position, detached.detached) == (1, True)
    # A grandchild carries the whole path.
    log.decide(ev.RunCreated, "p.0", 1, request_id="spawn/p/0", flow="child",
               payload_json="null", request_offset=0, parent_run_id="p")
    log.decide(ev.RunActivated, "p.0", 1, mode="new", activation=1)
    log.decide(ev.ChildSpawned, "p.0", 1, child_run_id="p.0.0", child_lineage_id="p.0.0",
               flow="child", position=0)
    [item] = [i for i in log.outbox(1) if i.request_id == "spawn/p.0/0"]
    assert json.loads(item.body_json)["ancestors"] == ["p", "p.0"]


def test_a_settled_child_with_a_parent_wakes_it_through_the_outbox() -> None:
    log = Log()
    log.start("p", flow="parent")
    spawn(log, "p", 3, "p.3")
    [item] = log.outbox(0)
    admit(log, item)
    assert log.outbox(1) == []
    log.decide(ev.RunCompleted, "p.3", 1, result_json="5")
    [wake] = log.outbox(1)
    assert (wake.request_id, wake.type, wake.run_id, wake.lineage_id) == (
        "wake/p.3", ev.RunWakeRequested.TYPE, "p", "p")
    assert json.loads(wake.body_json) == {
        "child_run_id": "p.3", "child_status": "completed", "result_json": "5",
        "error_type": None, "error_message": None, "position": 3, "flow": "child"}
    # A run with no parent wakes nobody.
    log.start("alone", 1)
    log.decide(ev.RunFailed, "alone", 1, error_type="ValueError", error_message="boom")
    assert [i.request_id for i in log.outbox(1)] == ["wake/p.3"]


def test_a_failed_or_cancelled_child_wakes_its_parent_with_its_error() -> None:
    log = Log()
    log.start("p", flow="parent")
    spawn(log, "p", 0, "p.0")
    spawn(log, "p", 1, "p.1")
    for item in log.outbox(0):
        admit(log, item)
    log.decide(ev.RunFailed, "p.0", 1, error_type="ValueError", error_message="boom")
    log.decide(ev.RunCancelled, "p.1", 1, reason="stop", requested_by="ops")
    bodies = {i.request_id: json.loads(i.body_json) for i in log.outbox(1)}
    assert bodies["wake/p.0"] == {
        "child_run_id": "p.0", "child_status": "failed", "result_json": None,
        "error_type": "ValueError", "error_message": "boom", "position": 0, "flow": "child"}
    assert (bodies["wake/p.1"]["child_status"], bodies["wake/p.1"]["error_type"],
            bodies["wake/p.1"]["error_message"]) == ("cancelled", "RunCancelled", "stop")


def test_a_wake_request_writes_the_outcome_into_the_spawn_entry_and_unlinks_the_child() -> None:
    log = Log()
    log.start("p", flow="parent")
    spawn(log, "p", 0, "p.0")
    spawn(log, "p", 1, "p.1")
    log.decide(ev.RunSuspended, "p", reason="child", position=2, child_run_id="p.0",
               child_position=0)
    wake: dict[str, Any] = {"child_run_id": "p.0", "child_status": "completed", "result_json": "5",
            "position": 0}
    assert log.ask(ev.RunWakeRequested, "p", "wake/p.0", **wake) is Verdict.applied
    run = log.run("p")
    assert run.children == (ChildLink("p.1", "p.1", 1),)
    assert run.status is RunStatus.suspended  # the owner's run.resumed ends the wait
    spawned = log.entry("p", 0)
    assert spawned is not None
    assert (spawned.kind, spawned.status, spawned.result_json, spawned.child_status,
            spawned.child_result_json) == ("spawn", "completed", '"p.0"', "completed", "5")
    assert log.ask(ev.RunWakeRequested, "p", "wake/p.0", **wake) is Verdict.duplicate
    # Another request for the same settled child changes nothing.
    assert log.ask(ev.RunWakeRequested, "p", "wake-again", **{
        **wake, "result_json": "6"}) is Verdict.ignored
    assert log.entry("p", 0) == spawned
    # What the owner decides next, and its effect: the child wait ends with the outcome.
    action = decide_waiting(log.run("p"), spawned)
    assert action == Wake("child", 2, "p.0", result_json="5")
    log.decide(ev.RunResumed, "p", reason=action.reason, position=action.position,
               name=action.name, result_json=action.result_json)
    child_wait = log.entry("p", 2)
    assert child_wait is not None
    assert (child_wait.kind, child_wait.status, child_wait.result_json) == (
        "child", "completed", "5")
    assert (log.run("p").status, log.run("p").wait) == (RunStatus.pending, None)


def test_a_wake_reaches_a_parent_that_has_ended() -> None:
    log = Log()
    log.start("p", flow="parent")
    spawn(log, "p", 0, "p.0", detach=True)
    log.decide(ev.RunCompleted, "p", result_json="1")
    assert log.ask(ev.RunWakeRequested, "p", "wake/p.0", child_run_id="p.0",
                   child_status="completed", result_json="2", position=0) is Verdict.applied
    assert log.run("p").children == ()
    spawned = log.entry("p", 0)
    assert spawned is not None and spawned.child_status == "completed"


def test_exit_policy_and_cascaded_cancel_put_cancel_requests_in_the_outbox() -> None:
    log = Log()
    log.start("p", flow="parent")
    spawn(log, "p", 0, "a")
    spawn(log, "p", 1, "b")
    spawn(log, "p", 2, "c", detach=True)
    acknowledged = [i.request_id for i in log.outbox(0)]
    log.decide(ev.PartitionOutboxSent, "", partition=0, request_ids=acknowledged)
    assert log.outbox(0) == []
    policy = exit_policy(log.run("p").children)
    assert policy == ExitPolicy(cancelled=["a", "b"], detached=["c"])
    assert log.decide(ev.ChildPolicyApplied, "p", cancelled=policy.cancelled,
                      detached=policy.detached, reason=ev.RunCompleted.TYPE) is Verdict.applied
    assert [(i.request_id, i.type, i.run_id, i.lineage_id) for i in log.outbox(0)] == [
        ("cancel/p/a", ev.RunCancelRequested.TYPE, "a", "a"),
        ("cancel/p/b", ev.RunCancelRequested.TYPE, "b", "b")]
    assert json.loads(log.outbox(0)[0].body_json) == {
        "reason": "parent p ended: run.completed", "requested_by": "p"}
    # A cancelled parent's cascade.
    log.start("q", flow="parent")
    spawn(log, "q", 0, "q.0")
    [spawned] = [i for i in log.outbox(0) if i.run_id == "q.0"]
    log.decide(ev.PartitionOutboxSent, "", partition=0, request_ids=["spawn/q/0"])
    log.ask(ev.RunCancelRequested, "q", "cq", reason="stop")
    # The policy's record carries the cascade; run.cancelled only names whom it reached.
    log.decide(ev.ChildPolicyApplied, "q", cancelled=["q.0"], detached=[],
               reason="cancelled (stop)")
    log.decide(ev.RunCancelled, "q", reason="stop", requested_by="ops", cascaded=["q.0"])
    [cascade] = [i for i in log.outbox(0) if i.run_id == "q.0"]
    assert cascade.request_id == "cancel/q/q.0"
    assert json.loads(cascade.body_json) == {
        "reason": "parent q ended: cancelled (stop)", "requested_by": "q"}
    # Delivered, the child takes it as any cancel request (a run not q's child refuses it:
    # tests/unit/test_chosen_child_ids.py).
    log.deliver(spawned, 1)
    assert log.deliver(cascade, 1) is Verdict.applied
    assert log.run("q.0").cancel_requested == "parent q ended: cancelled (stop)"


def test_outbox_sent_removes_the_acknowledged_requests_of_its_own_partition() -> None:
    log = Log()
    log.start("p", flow="parent")
    for position in range(3):
        spawn(log, "p", position, f"p.{position}")
    assert [i.request_id for i in log.outbox(0)] == ["spawn/p/0", "spawn/p/1", "spawn/p/2"]
    # Another partition's acknowledgement does not touch this outbox.
    log.decide(ev.PartitionOutboxSent, "", 1, partition=1, request_ids=["spawn/p/0"])
    assert len(log.outbox(0)) == 3
    # A stale owner's acknowledgement is fenced: nothing leaves the outbox.
    stale = Writer("zombie")
    assert log.decide(ev.PartitionOutboxSent, "", writer=stale, partition=0,
                      request_ids=["spawn/p/0"]) is Verdict.fenced
    assert len(log.outbox(0)) == 3
    assert log.decide(ev.PartitionOutboxSent, "", partition=0,
                      request_ids=["spawn/p/0", "spawn/p/2", "unknown"]) is Verdict.applied
    assert [i.request_id for i in log.outbox(0)] == ["spawn/p/1"]


# -- fencing and settlement ----------------------------------------------------------------------


def test_fenced_waits_wakes_and_spawns_change_nothing() -> None:
    log = Log("a")
    old = log.writer
    sleeping(log, "r1")
    log.start("r2")
    new = Writer("b", epoch=2)
    log.apply(new.claim(0))
    before = dict(log.projection.runs), log.projection.journal("r1")
    verdicts = [
        log.decide(ev.RunSuspended, "r2", writer=old, reason="timer", position=0,
                   wake_at_ms=DUE),
        log.decide(ev.TimerFired, "r1", writer=old, position=1, due_ms=DUE),
        log.decide(ev.RunResumed, "r1", writer=old, reason="operator", position=1,
                   name="sleep", result_json="null"),
        log.decide(ev.ChildSpawned, "r2", writer=old, child_run_id="r2.0",
                   child_lineage_id="r2.0", flow="child", position=0),
        log.decide(ev.RunCompleted, "r2", writer=old, result_json="1"),
        # The right epoch, but not the owner.
        log.decide(ev.RunSuspended, "r2", writer=Writer("c", epoch=2), reason="timer",
                   position=0, wake_at_ms=DUE),
    ]
    assert verdicts == [Verdict.fenced] * 6
    assert (dict(log.projection.runs), log.projection.journal("r1")) == before
    assert log.projection.journal("r2") == ()
    assert log.timers() == [DueTimer(DUE, "r1", 1)] and log.outbox(0) == []
    assert log.projection.partition(0).fenced == 6


def test_a_run_that_ends_holds_no_wait_no_signal_and_no_timer() -> None:
    log = Log()
    waiting(log, due_ms=DUE)
    signal(log, "r1", "s1", name="other")
    log.ask(ev.RunCancelRequested, "r1", "c1", reason="stop")
    log.ask(ev.RunResumeRequested, "r1", "o1", operator="ops")
    assert log.run("r1").resume_requested
    log.decide(ev.RunCancelled, "r1", reason="stop")
    run = log.run("r1")
    assert (run.status, run.wait, run.signals, run.resume_requested) == (
        RunStatus.cancelled, None, (), False)
    assert (run.error_type, run.error_message) == ("RunCancelled", "stop")
    assert log.timers() == []
    assert signal(log, "r1", "s2") is Verdict.refused
    assert log.decide(ev.TimerFired, "r1", position=0, due_ms=DUE) is Verdict.ignored
    # A running run's unused signals go with it too.
    log.start("r2")
    signal(log, "r2", "s3", name="never-awaited")
    log.decide(ev.RunCompleted, "r2", result_json="1")
    assert log.run("r2").signals == ()


# -- projections.decide ---------------------------------------------------------------------------


def state(**fields: Any) -> RunState:
    base = RunState(run_id="r1", lineage_id="r1", partition=0, flow="f", payload_json="null",
                    request_id="q1", request_offset=0, created_at_ms=0, updated_at_ms=0,
                    status=RunStatus.suspended, admitted=True, activations=1)
    return replace(base, **fields)


def sig(request_id: str, name: str, payload: str = "null") -> Signal:
    return Signal(request_id=request_id, name=name, payload_json=payload, offset=0)


EVENT = Wait(kind="event", position=3, due_ms=DUE, event_name="approval")
TIMER = Wait(kind="timer", position=2, due_ms=DUE)
CHILD = Wait(kind="child", position=4, child_run_id="r1.1", child_position=1)


def spawn_entry(**fields: Any) -> JournalEntry:
    return JournalEntry(position=1, name="child", kind="spawn", status="completed",
                        attempts=1, result_json='"r1.1"', **fields)


@pytest.mark.parametrize("wait", [EVENT, TIMER, CHILD], ids=lambda w: w.kind)
def test_decide_waiting_a_cancel_beats_everything(wait: Wait) -> None:
    run = state(wait=wait, signals=(sig("s1", "approval"),), resume_requested=True,
                cancel_requested="stop", cancel_requested_by="ops")
    woken = decide_waiting(run, spawn_entry(child_status="completed"))
    # The wait ends Cancelled at its position: the handler meets the cancel there (and its
    # finally blocks run); no signal is taken and no child outcome delivered.
    assert isinstance(woken, Wake)
    assert woken.position == wait.position
    assert (woken.signal_request_id, woken.result_json, woken.error_type) == (
        None, None, CANCEL_DELIVERED)
    assert woken.reason not in ("event", "child")
    # Once delivered, the same cancel ends no other wait: a cleanup wait waits normally.
    delivered = replace(run, cancel_delivered_at=0, resume_requested=False, signals=())
    assert decide_waiting(delivered, spawn_entry()) is None


def test_decide_waiting_cancels_a_quarantined_run_or_one_without_a_wait_at_once() -> None:
    quarantined = state(wait=Wait(kind="quarantine"), cancel_requested="stop",
                        cancel_requested_by="ops")
    assert decide_waiting(quarantined, None) == CancelNow("stop", "ops")
    assert decide_waiting(replace(quarantined, wait=None), None) == CancelNow("stop", "ops")
    # Without a cancel a quarantine waits for its resolution, operator resume or not.
    assert decide_waiting(state(wait=Wait(kind="quarantine"), resume_requested=True),
                          None) is None


def test_decide_waiting_an_operator_ends_a_sleep_or_times_out_a_signal_wait() -> None:
    assert decide_waiting(state(wait=TIMER, resume_requested=True), None) == Wake(
        "operator", 2, "sleep", result_json="null")
    woken = decide_waiting(state(wait=EVENT, resume_requested=True,
                                 signals=(sig("s1", "approval"),)), None)
    assert isinstance(woken, Wake)
    assert (woken.reason, woken.position, woken.name, woken.error_type, woken.result_json,
            woken.signal_request_id) == ("operator", 3, "approval", WAIT_TIMEOUT, None, None)
    # A child wait is not resumable by an operator: it ends when the child settles.
    assert decide_waiting(state(wait=CHILD, resume_requested=True), spawn_entry()) is None


def test_decide_waiting_an_event_wait_takes_the_first_matching_signal() -> None:
    signals = (sig("s1", "item", '"x"'), sig("s2", "approval", '"first"'),
               sig("s3", "approval", '"second"'))
    assert decide_waiting(state(wait=EVENT, signals=signals), None) == Wake(
        "event", 3, "approval", "s2", '"first"')
    assert decide_waiting(state(wait=EVENT, signals=signals[:1]), None) is None
    assert decide_waiting(state(wait=TIMER, signals=signals), None) is None  # sleeps on


def test_decide_waiting_a_child_wait_ends_with_the_childs_outcome() -> None:
    run = state(wait=CHILD)
    assert decide_waiting(run, None) is None
    assert decide_waiting(run, spawn_entry()) is None  # the child has not settled
    assert decide_waiting(run, spawn_entry(child_status="completed",
                                           child_result_json="42")) == Wake(
        "child", 4, "r1.1", result_json="42")
    assert decide_waiting(run, spawn_entry(child_status="failed", error_type="ValueError",
                                           error_message="boom")) == Wake(
        "child", 4, "r1.1", error_type=CHILD_FAILED, error_message="ValueError: boom")
    assert decide_waiting(run, spawn_entry(child_status="cancelled", error_type="RunCancelled",
                                           error_message="stop")) == Wake(
        "child", 4, "r1.1", error_type=CHILD_CANCELLED, error_message="stop")
    assert decide_waiting(run, spawn_entry(child_status="cancelled")) == Wake(
        "child", 4, "r1.1", error_type=CHILD_CANCELLED, error_message="cancelled")


def test_decide_waiting_nothing_ends_a_plain_sleep() -> None:
    assert decide_waiting(state(wait=TIMER), None) is None
    assert decide_waiting(state(wait=None), None) is None


def test_cancel_on_pending_only_for_an_admitted_run_that_never_ran() -> None:
    pending = state(status=RunStatus.pending, activations=0, cancel_requested="stop",
                    cancel_requested_by="ops")
    assert cancel_on_pending(pending) == CancelNow("stop", "ops")
    assert cancel_on_pending(replace(pending, cancel_requested=None)) is None
    assert cancel_on_pending(replace(pending, admitted=False)) is None
    assert cancel_on_pending(replace(pending, activations=1)) is None  # its handler meets it


def test_exit_policy_cancels_linked_children_and_leaves_detached_ones() -> None:
    links = [ChildLink("a", "a", 0), ChildLink("b", "b", 1, detached=True),
             ChildLink("c", "c", 2)]
    assert exit_policy(links) == ExitPolicy(cancelled=["a", "c"], detached=["b"])
    assert exit_policy(iter(links)) == ExitPolicy(cancelled=["a", "c"], detached=["b"])
    assert exit_policy([]) == ExitPolicy(cancelled=[], detached=[])


def test_a_handoff_that_lands_after_a_cancel_is_the_cancellation() -> None:
    """The handler handed off before the cancel reached it, and the cancel was applied
    first: the round ends cancelled, and no next round is made."""
    log = Log()
    log.start("h")
    log.ask(ev.RunCancelRequested, "h", "stop", reason="stop")
    log.decide(ev.RunHandedOff, "h", next_run_id="h~1", round=1, payload_json="null")
    assert log.run("h").status is RunStatus.cancelled
    assert "h~1" not in log.projection.runs
