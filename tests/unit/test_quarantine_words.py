"""What a quarantine found by a takeover says of how the run changed owner
(engine.flow.port.quarantine_message): a release's drain cuts a step still running, a run
taken after its owner died was never released (no drain cut it)."""

from __future__ import annotations

from runstream.engine.flow.port import TAKEOVER_MODES, Quarantined, quarantine_message
from runstream.projections.decide import plan_activation
from runstream.projections.state import JournalEntry, RunState, RunStatus

STARTED = Quarantined(JournalEntry(position=0, name="charge", irreversible=True))


def taken(status: RunStatus, released: str | None) -> tuple[str, str]:
    run = RunState(run_id="r", lineage_id="r", partition=0, flow="f", payload_json="{}",
                   request_id="q", request_offset=0, created_at_ms=0, updated_at_ms=0,
                   admitted=True, status=status, activations=1, owner_source="abcdef0123",
                   owner_epoch=3, released_cause=released)
    plan = plan_activation(run, lambda source: f"source {source[:8]}", now_ms=30_000)
    assert plan.mode in TAKEOVER_MODES
    return plan.mode, plan.evidence


def test_a_step_a_release_cut_names_the_drain() -> None:
    message = quarantine_message(STARTED, taken(RunStatus.pending, "rebalance"))
    assert "released the run on revocation (a rebalance)" in message
    assert "--drain-timeout" in message


def test_a_step_its_dead_owner_left_names_no_drain() -> None:
    message = quarantine_message(STARTED, taken(RunStatus.running, None))
    assert "left the run running without releasing it" in message
    assert "drain" not in message


def test_a_first_activation_s_quarantine_says_nothing_of_owners() -> None:
    assert "owner changed" not in quarantine_message(STARTED)
