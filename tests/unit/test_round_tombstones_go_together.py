"""Round 0's tombstone goes with the tombstones of the later rounds of its lineage that
expired with it (projections.expiry.sweep_body): a sweep's batch of tombstones ended between
them (ordered by expiry time then run id, `l` before `l~1`), round 0's going freed the id
`l`, a new lineage `l` handed off into `l~1` while the old round's tombstone was kept, and
that tombstone's going, a sweep later, took the new round's history."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from runstream.engine.journal import events as ev
from runstream.projections import expiry
from runstream.projections.expiry import SWEEP_BATCH, sweep_body
from runstream.projections.replay import replay_run
from runstream.projections.state import RunStatus, Verdict, replace
from runstream.projections.values import tombstone_retention_ms
from tests.builders import request
from tests.unit.test_retention_core import RETENTION_MS, Journal, at, journal

__all__ = ["journal"]  # (the fixture, used by name)


def sweep(journal: Journal, after_ms: int) -> dict[str, Any] | None:
    """The owner's sweep `after_ms` from now, journaled then (both stores sweep alike)."""
    now = journal.now + after_ms
    body = sweep_body(journal.store, journal.projector.partition(0), now,
                      journal.projector.lineage_facts)
    assert body == sweep_body(journal.memory.store, journal.memory.partition(0), now,
                              journal.memory.projector.lineage_facts)
    assert body is not None
    journal.add(journal.owner.decide(ev.PartitionRunsExpired, run_id="", **body),
                after_ms=after_ms)
    return body


def lineage(journal: Journal, request_id: str, *, finish: bool) -> None:
    """`loop` hands off to `loop~1`, which takes a step (and completes when `finish`)."""
    offset = len(journal.records)
    journal.add(request(ev.RunCreateRequested, run_id="loop", request_id=request_id,
                        flow="checkout", payload_json="{}"))
    assert journal.decide(ev.RunCreated, "loop", request_id=request_id, flow="checkout",
                          payload_json="{}", request_offset=offset,
                          incarnation=offset) is Verdict.applied
    journal.decide(ev.RunActivated, "loop", mode="fresh", activation=1)
    handoff = journal.owner.decide(ev.RunHandedOff, run_id="loop", next_run_id="loop~1",
                                   round=1, payload_json="{}", flow="checkout")
    journal.add(at(handoff, journal.now + 10))
    journal.decide(ev.RunActivated, "loop~1", mode="fresh", activation=1)
    journal.decide(ev.StepCompleted, "loop~1", position=0, name="charge",
                   result_json=f'"{request_id}"')
    if finish:
        journal.decide(ev.RunCompleted, "loop~1", result_json='"done"')


def test_round_zeros_tombstone_takes_its_later_rounds_along(journal: Journal) -> None:
    # SWEEP_BATCH - 1 runs' tombstones fall due before the lineage's two: the batch ends
    # at `loop`.
    for n in range(SWEEP_BATCH - 1):
        journal.run_to_completion(f"f{n:03d}", f"q-{n}")
    lineage(journal, "req-old", finish=True)
    assert len(sweep(journal, RETENTION_MS + 100)["expired"]) == SWEEP_BATCH - 1  # type: ignore[index]
    assert sweep(journal, 100)["expired"] == ["loop~1"]  # type: ignore[index]
    body = sweep(journal, tombstone_retention_ms(journal.projector.partition(0)) + 200)
    assert body is not None and body["dropped"][-2:] == ["loop", "loop~1"]
    assert journal.store.tombstone("loop~1") is None and journal.store.count_tombstones(0) == 0
    # The id is free, its rounds' ids with it: a new lineage hands off into `loop~1`.
    lineage(journal, "req-new", finish=False)
    history = [(h.offset, h.type) for h in journal.store.history("loop~1")]
    assert history[0][1] == ev.RunHandedOff.TYPE and len(history) == 3
    run, entries = replay_run(dataclasses.replace(item, record=journal.records[item.offset][0])
                              for item in journal.store.history("loop~1"))
    assert run is not None and run.status is RunStatus.running
    assert entries[0].result_json == '"req-new"'
    journal.agree()


def test_round_zeros_tombstone_waits_for_a_later_round_s(
    journal: Journal, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A later round's tombstone that may not go yet (one that expired after its round 0's,
    in a store written before rounds expired in order) keeps round 0's."""
    lineage(journal, "req-old", finish=True)
    sweep(journal, RETENTION_MS + 100)
    held = journal.store.tombstone
    stone = held("loop~1")
    assert stone is not None
    later = replace(stone, expired_ms=stone.expired_ms + 10**9)
    monkeypatch.setattr(journal.store, "tombstone",
                        lambda run_id: later if run_id == "loop~1" else held(run_id))
    now = journal.now + tombstone_retention_ms(journal.projector.partition(0)) + 200
    assert sweep_body(journal.store, journal.projector.partition(0), now,
                      journal.projector.lineage_facts) is None


def test_a_small_look_never_splits_a_lineage(journal: Journal,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(expiry, "SWEEP_LOOK", 1)
    lineage(journal, "req-old", finish=True)
    sweep(journal, RETENTION_MS + 100)
    body = sweep(journal, tombstone_retention_ms(journal.projector.partition(0)) + 200)
    assert body is not None and body["dropped"] == ["loop", "loop~1"]
    journal.agree()
