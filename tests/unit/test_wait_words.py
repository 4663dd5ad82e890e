"""An update's wait is on the signal `update/<name>`, which no client can send: every
reader says it in words as an update (the dry-run report said "wait for signal
'update/discount'")."""

from __future__ import annotations

from runstream.engine.timetravel.dryrun_report import call_decision, wait_intent
from runstream.projections.state import Wait
from runstream.projections.updates import event_words, signal_name


def test_an_update_wait_is_named_as_an_update_and_a_signal_wait_as_a_signal() -> None:
    assert event_words(signal_name("discount")) == "update 'discount'"
    assert event_words("go") == "signal 'go'"
    update_wait = Wait(kind="event", position=2, event_name=signal_name("discount"))
    assert wait_intent(None, update_wait).text == "wait for update 'discount' at position 2"
    call = call_decision("wait", signal_name("discount"), 2, None, None)
    assert call.text == "wait for update 'discount' at position 2"
    assert wait_intent(None, Wait(kind="event", position=1, event_name="go")).text \
        == "wait for signal 'go' at position 1"
