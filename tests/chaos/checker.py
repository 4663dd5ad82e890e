"""The chaos checker: after the load and the faults, the journal, the ledger and every
projection must agree with the engine's promises. Each broken promise is one line in
`Verdict.violations`; the session passes when there is none."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from pathlib import Path

from runstream.projections.state import RunState
from tests.chaos.flows import CHILD_STEPS, PARENT_STEPS, chaos, chaos_child
from tests.chaos.journal_facts import JournalFacts, Quarantine
from tests.chaos.windows import FaultWindow, cut_off_by, fault_in_effect

MAX_LISTED = 20  # violations of one kind listed in full; the rest are counted


@dataclass(frozen=True, slots=True)
class Execution:
    pid: int
    started_ms: int


def read_ledger(path: Path) -> dict[tuple[str, str], list[Execution]]:
    """(run id, step) -> every execution the step functions recorded, in ledger order."""
    found: dict[tuple[str, str], list[Execution]] = collections.defaultdict(list)
    if path.exists():
        for line in path.read_text().splitlines():
            run_id, step, pid, started = line.split()
            found[(run_id, step)].append(Execution(int(pid), int(started)))
    return found


@dataclass
class CheckReport:
    runs: int = 0
    children: int = 0
    completed: int = 0
    quarantined: int = 0
    executions: int = 0
    re_executions: int = 0
    fenced: int = 0
    rejected_claims: int = 0
    stores_verified: int = 0
    records: int = 0
    longest_owner_wait_ms: int = 0
    longest_owner_wait_run: str = "-"
    # Quarantines by what the ledger says of their step, each by the fault in effect over
    # it: "ran" (the effect may have happened: the quarantine is right), "cut off" (never
    # ran, but its writer died or lost its producer before it could say so), "never ran"
    # (a violation: the step was left started by a writer that went on).
    quarantine_faults: dict[str, collections.Counter[str]] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter))
    violations: list[str] = field(default_factory=list)
    _per_kind: collections.Counter[str] = field(default_factory=collections.Counter)

    def violation(self, kind: str, message: str) -> None:
        self._per_kind[kind] += 1
        if self._per_kind[kind] <= MAX_LISTED:
            self.violations.append(f"[{kind}] {message}")
        elif self._per_kind[kind] == MAX_LISTED + 1:
            self.violations.append(f"[{kind}] ... more of this kind not listed")

    @property
    def violation_count(self) -> int:
        return sum(self._per_kind.values())


def _quarantined_with_evidence(run: RunState) -> bool:
    return (run.wait is not None and run.wait.kind == "quarantine"
            and len(run.evidence) > 0)


def check_runs(facts: JournalFacts, expected: set[str], report: CheckReport) -> None:
    """Every run ended with exactly one terminal decision, or sits in quarantine with
    evidence; nothing it was asked (create, signal, wake) is left unanswered."""
    runs = facts.projection.runs
    missing = expected - runs.keys()
    for run_id in sorted(missing):
        report.violation("lost", f"run {run_id} was created by the load but is not in the "
                         f"journal")
    for run in runs.values():
        if run.flow == chaos.name:
            report.runs += 1
        elif run.flow == chaos_child.name:
            report.children += 1
        terminal = facts.terminal_decisions[run.run_id]
        if run.status.is_terminal and terminal == 1:
            report.completed += run.status.value == "completed"
            if run.status.value != "completed":
                report.violation("failed", f"run {run.run_id} {run.status.value}: "
                                 f"{run.error_type}: {run.error_message}")
        elif _quarantined_with_evidence(run) and terminal == 0:
            report.quarantined += 1
        else:
            report.violation("terminal", f"run {run.run_id} is {run.status.value} "
                             f"(wait {run.wait}) with {terminal} terminal decisions applied")
        if run.inbox or run.signals or run.children:
            report.violation("unanswered", f"run {run.run_id} still holds inbox "
                             f"{[i.type for i in run.inbox]}, signals "
                             f"{[s.name for s in run.signals]}, open children "
                             f"{[c.run_id for c in run.children]}")
    for partition in sorted(facts.projection.partitions):
        outbox = facts.projection.store.outbox(partition)
        if outbox:
            report.violation("unanswered", f"partition {partition} outbox still holds "
                             f"{len(outbox)} requests, e.g. {outbox[0].type} to "
                             f"{outbox[0].run_id}")


def check_ledger(facts: JournalFacts, ledger: dict[tuple[str, str], list[Execution]],
                 report: CheckReport) -> None:
    """No step whose completion was applied started again after that completion was
    appended; every applied completion was really executed; each step completed once."""
    for key, count in facts.completions.items():
        if count > 1:
            report.violation("settled-twice", f"step {key} has {count} applied completions")
    for run in facts.projection.runs.values():
        steps = PARENT_STEPS if run.flow == chaos.name else CHILD_STEPS
        for step in steps:
            key = (run.run_id, step)
            done_at = facts.completed_at.get(key)
            executions = ledger.get(key, [])
            report.executions += len(executions)
            report.re_executions += max(0, len(executions) - 1)
            if done_at is not None and not executions:
                report.violation("ledger", f"step {key} completed with no execution in the "
                                 f"ledger")
            for execution in executions:
                if done_at is not None and execution.started_ms > done_at:
                    report.violation(
                        "re-run-after-applied",
                        f"step {key} started at {execution.started_ms} in pid {execution.pid}, "
                        f"{execution.started_ms - done_at} ms after its completion was "
                        f"appended and applied")


def check_quarantines(facts: JournalFacts, ledger: dict[tuple[str, str], list[Execution]],
                      windows: list[FaultWindow], report: CheckReport) -> None:
    """A quarantine says the step's effect may have happened. One whose step never ran
    (no ledger line) is allowed only when its writer was cut off without a word: it wrote
    nothing more about the run, and a kill -9 or a SIGSTOP of that worker or a broker
    restart (its producer fails) was in effect. Otherwise the worker knew the step was never called
    (a drain, a graceful stop) and should have said so."""
    for quarantine in facts.quarantines.values():
        window = fault_in_effect(windows, quarantine.started_ms, quarantine.quarantined_ms)
        fault = window.kind if window is not None else "none"
        if ledger.get((quarantine.run_id, quarantine.step)):
            report.quarantine_faults["ran"][fault] += 1
        elif not quarantine.writer_went_on and cut_off_by(
                windows, quarantine.writer, quarantine.started_ms, quarantine.quarantined_ms):
            report.quarantine_faults["cut off"][fault] += 1
        else:
            report.quarantine_faults["never ran"][fault] += 1
            report.violation("quarantine-not-run", _never_ran(quarantine, fault))


def _never_ran(quarantine: Quarantine, fault: str) -> str:
    went_on = ("went on writing about the run" if quarantine.writer_went_on
               else "wrote nothing more, but no kill -9 or SIGSTOP of it nor broker restart "
                    "was in effect")
    return (f"run {quarantine.run_id} quarantined at {quarantine.quarantined_ms} on step "
            f"{quarantine.step!r} (started at {quarantine.started_ms} by "
            f"{quarantine.writer}), which never ran: its writer {went_on}; fault in "
            f"effect: {fault}")


def check_fencing(facts: JournalFacts, report: CheckReport) -> None:
    for message in facts.stale_applied:
        report.violation("stale-applied", message)
    report.fenced = facts.verdicts["fenced"]
    report.rejected_claims = facts.verdicts["rejected"]
    if facts.verdicts["dead-letter"]:
        report.violation("dead-letter", f"{facts.verdicts['dead-letter']} records could not "
                         f"be decoded")


def check_journal(facts: JournalFacts, expected: set[str],
                  ledger: dict[tuple[str, str], list[Execution]],
                  windows: list[FaultWindow]) -> CheckReport:
    """Everything the journal, the ledger and the faults' windows can tell."""
    report = CheckReport(records=facts.records)
    check_runs(facts, expected, report)
    check_ledger(facts, ledger, report)
    check_quarantines(facts, ledger, windows, report)
    check_fencing(facts, report)
    if facts.longest_owner_wait is not None:
        report.longest_owner_wait_ms = facts.longest_owner_wait.waited_ms
        report.longest_owner_wait_run = facts.longest_owner_wait.run_id
    return report
