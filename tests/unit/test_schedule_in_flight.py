"""A schedule's decisions name no run (their envelope's lineage is the schedule): what the
worker holds in flight for one is by its subject (projections.reactions.subject_of), and
the timer sweeper fires a due schedule again only once all of its decisions in flight
have applied. Before, the first record's verdict of a write of several (fires and skips
of a catch-up) let the sweeper decide the instants after it a second time."""

from __future__ import annotations

from typing import Any

from runstream.engine.journal import events as ev
from runstream.engine.journal.records import decision_envelope
from runstream.engine.worker.confirmations import Confirmations
from runstream.engine.worker.timers import SCHEDULE_KEY, SCHEDULE_POSITION, TimerSweeper
from runstream.projections.cron import fired_run_id
from runstream.projections.reactions import DecidedKeys, subject_of
from runstream.projections.state import Verdict


def _fire(seq: int, nominal: int) -> ev.ScheduleFired:
    return ev.ScheduleFired(
        envelope=decision_envelope(ev.ScheduleFired.TYPE, "", lineage_id="s", epoch=1,
                                   source_id="w", source_seq=seq, now_ms=0),
        schedule_id="s", nominal_ms=nominal, run_id=fired_run_id("s", nominal),
        reason="schedule", next_fire_ms=nominal + 1000)


def test_a_schedule_is_in_flight_until_the_last_of_its_decisions_applies() -> None:
    confirmations, decided = Confirmations(), DecidedKeys()
    sweeper = TimerSweeper(owner=Any)  # (judging reads nothing of its owner)
    subject = subject_of("", "s")
    assert subject == SCHEDULE_KEY + "s" and subject_of("r-1", "r") == "r-1"
    decided.add("schedule-due/s/1000", subject)
    sweeper._in_flight[subject] = (0, SCHEDULE_POSITION)  # as _fire_schedules marks it
    for seq in (1, 2, 3):  # one write: three instants of a catch-up
        confirmations.sent(subject, 0, seq)
    for seq in (1, 2):
        settled = confirmations.applied(0, _fire(seq, 1000 * seq), Verdict.applied)
        sweeper.judged_record(_fire(seq, 1000 * seq), settled)
        decided.applied(_fire(seq, 1000 * seq).envelope, drained=settled)
        assert not settled and subject in sweeper._in_flight
        assert "schedule-due/s/1000" in decided
    settled = confirmations.applied(0, _fire(3, 3000), Verdict.applied)
    sweeper.judged_record(_fire(3, 3000), settled)
    decided.applied(_fire(3, 3000).envelope, drained=settled)
    assert settled and subject not in sweeper._in_flight and len(decided) == 0
