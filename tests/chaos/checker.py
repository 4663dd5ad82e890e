"""The chaos checker: after the load and the faults, the journal, the ledger and every
projection must agree with the engine's promises. Each broken promise is one line in
`Verdict.violations`; the session passes when there is none."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from pathlib import Path

from projections.state import RunState
from tests.chaos.flows import CHILD_STEPS, PARENT_STEPS, chaos, chaos_child
from tests.chaos.journal_facts import JournalFacts

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


def check_fencing(facts: JournalFacts, report: CheckReport) -> None:
    for message in facts.stale_applied:
        report.violation("stale-applied", message)
    report.fenced = facts.verdicts["fenced"]
    report.rejected_claims = facts.verdicts["rejected"]
    if facts.verdicts["dead-letter"]:
        report.violation("dead-letter", f"{facts.verdicts['dead-letter']} records could not "
                         f"be decoded")


def check_journal(facts: JournalFacts, expected: set[str],
                  ledger: dict[tuple[str, str], list[Execution]]) -> CheckReport:
    """Everything the journal and the ledger alone can tell."""
    report = CheckReport(records=facts.records)
    check_runs(facts, expected, report)
    check_ledger(facts, ledger, report)
    check_fencing(facts, report)
    if facts.longest_owner_wait is not None:
        report.longest_owner_wait_ms = facts.longest_owner_wait.waited_ms
        report.longest_owner_wait_run = facts.longest_owner_wait.run_id
    return report
