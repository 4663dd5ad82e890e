"""The chaos checker's quarantine rule and the faults' windows, on hand-built journals (no
broker): a quarantine whose step never ran is a violation unless its writer was cut off
(killed, stopped by SIGSTOP, or its producer failed in a broker restart) before it could
say so; a fault is in
effect until the worker it waits for claimed again, not only at the instant it fired."""

from __future__ import annotations

import pytest

from runstream.engine.journal import encode
from runstream.engine.journal import events as ev
from tests.builders import Writer, create
from tests.chaos.checker import CheckReport, Execution, check_quarantines
from tests.chaos.journal_facts import JournalFacts
from tests.chaos.schedule import BROKER, JOIN, KILL, PAUSE
from tests.chaos.windows import (
    ANY_OWNER,
    MAX_AFTERMATH_MS,
    FaultEvent,
    FaultWindow,
    fault_in_effect,
    fault_windows,
)

T0 = 1_800_000_000_000


class Journal:
    """Records folded into JournalFacts at log times a second apart (partition 0, unless
    told)."""

    def __init__(self) -> None:
        self.facts = JournalFacts()
        self.offsets = [0, 0]
        self.records = 0

    def add(self, record: ev.JournalRecord, partition: int = 0) -> int:
        value, headers = encode(record)
        at = T0 + self.records * 1000
        self.facts.fold(partition, self.offsets[partition], value, tuple(headers), at)
        self.offsets[partition] += 1
        self.records += 1
        return at


def charge_started(journal: Journal, writer: Writer, owner: str) -> int:
    """A claim by `writer`, run r created and activated, its irreversible step started:
    the log time of that step.started."""
    journal.add(writer.claim(0, owner=owner, generation=writer.epoch))
    journal.add(create("r", "q1", flow="chaos"))
    journal.add(writer.decide(ev.RunCreated, run_id="r", request_id="q1", flow="chaos",
                              payload_json="{}", request_offset=1))
    journal.add(writer.decide(ev.RunActivated, run_id="r", mode="new", activation=1))
    return journal.add(writer.decide(ev.StepStarted, run_id="r", position=0, name="charge"))


def quarantine(journal: Journal, writer: Writer, owner: str, generation: int) -> int:
    journal.add(writer.claim(0, owner=owner, generation=generation))
    journal.add(writer.decide(ev.RunActivated, run_id="r", mode="claimed", activation=2))
    return journal.add(writer.decide(ev.RunSuspended, run_id="r", reason="quarantine",
                                     position=0))


def checked(journal: Journal, ledger: dict[tuple[str, str], list[Execution]],
            events: list[FaultEvent]) -> CheckReport:
    report = CheckReport()
    windows = fault_windows(events, journal.facts.claims)
    check_quarantines(journal.facts, ledger, windows, report)
    return report


def event(kind: str, target: str, at_ms: int, ended_ms: int, awaits: str = "") -> FaultEvent:
    return FaultEvent(kind, 0.0, target, "", 0.0, at_ms, ended_ms, awaits)


def test_a_quarantine_whose_step_never_ran_after_a_drain_is_a_violation() -> None:
    """The chaos finding: the worker released the run (a rebalance) while the step's
    step.started was unconfirmed, claimed the partition again and quarantined its own
    run, although `charge` never ran."""
    journal = Journal()
    worker = Writer("source-a", epoch=1)
    charge_started(journal, worker, "w0.1")
    journal.add(worker.decide(ev.RunReleased, run_id="r", cause="rebalance"))
    worker.epoch = 2
    quarantine(journal, worker, "w0.1", generation=2)
    journal.add(Writer("source-j").claim(1, owner="w3.1", generation=2), partition=1)
    report = checked(journal, {}, [event(JOIN, "w3.1", T0, T0, awaits="w3.1")])
    assert report.violation_count == 1
    assert report.violations[0].startswith("[quarantine-not-run] run r quarantined")
    assert "went on writing" in report.violations[0]
    assert dict(report.quarantine_faults["never ran"]) == {JOIN: 1}


def test_a_quarantine_whose_step_ran_is_allowed() -> None:
    journal = Journal()
    worker = Writer("source-a", epoch=1)
    started = charge_started(journal, worker, "w0.1")
    quarantine(journal, Writer("source-b", epoch=2), "w1.1", generation=2)
    ledger = {("r", "charge"): [Execution(pid=7, started_ms=started)]}
    report = checked(journal, ledger, [event(KILL, "w0.1", started + 10, started + 20)])
    assert report.violation_count == 0
    assert dict(report.quarantine_faults["ran"]) == {KILL: 1}


@pytest.mark.parametrize("fault", [KILL, PAUSE])
def test_a_step_that_never_ran_is_excused_only_when_its_writer_was_killed_or_stopped(
        fault: str) -> None:
    """Killed, or stopped by SIGSTOP past its session, between its step.started and the
    call: nobody can know whether the effect happened (the chaos run of seed 105860: w1.1
    stopped 14.6 s, the new owner quarantined 6 s after the start). The same fault on
    another worker excuses nothing."""
    for target, violations in (("w0.1", 0), ("w1.1", 1)):
        journal = Journal()
        started = charge_started(journal, Writer("source-a", epoch=1), "w0.1")
        quarantine(journal, Writer("source-b", epoch=2), "w1.1", generation=2)
        cut = event(fault, target, started + 100, started + 200, awaits=target)
        report = checked(journal, {}, [cut])
        assert report.violation_count == violations, report.violations
        kind = "cut off" if violations == 0 else "never ran"
        assert dict(report.quarantine_faults[kind]) == {fault: 1}


def test_a_kill_is_in_effect_until_its_replacement_claimed() -> None:
    """The kill fired long before the step started; its effect lasted until w0.2 claimed
    (other workers' claims meanwhile do not end it)."""
    claims = [(T0 + 5_000, "w1.1"), (T0 + 20_000, "w0.2"), (T0 + 30_000, "w0.2")]
    kill = event(KILL, "w0.1", T0, T0 + 500, awaits="w0.2")
    assert fault_windows([kill], claims) == [FaultWindow(KILL, "w0.1", T0, T0 + 20_000)]
    assert fault_in_effect(fault_windows([kill], claims), T0 + 15_000, T0 + 16_000) is not None
    assert fault_in_effect(fault_windows([kill], []), T0 + 15_000, T0 + 16_000) is None


def test_windows_of_a_pause_a_broker_restart_and_an_effect_followed_at_most_so_far() -> None:
    pause = event(PAUSE, "w2.1", T0, T0 + 3_000)  # a short pause: until SIGCONT
    broker = event(BROKER, "broker", T0, T0 + 10_000, awaits=ANY_OWNER)
    late = event(KILL, "w0.1", T0, T0 + 1_000, awaits="w0.2")
    claims = [(T0 + 12_000, "w1.1"), (T0 + 1_000 + MAX_AFTERMATH_MS + 1, "w0.2")]
    assert [(w.kind, w.end_ms) for w in fault_windows([pause, broker, late], claims)] == [
        (PAUSE, T0 + 3_000), (BROKER, T0 + 12_000), (KILL, T0 + 1_000)]
