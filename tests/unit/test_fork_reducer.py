"""The reducer on a fork's records at the new run's partition (run.fork-part, run.forked,
journal.entry-copied; the first shape of run.fork-requested in the fixture), the owner's fork
decisions, and the fork planner's pure parts: no broker. The source's side (the request,
its answer, authorities) is tests/unit/test_fork_source.py."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from runstream.engine.journal import Envelope, encode
from runstream.engine.journal import events as ev
from runstream.projections.decide import fork_decisions
from runstream.projections.fork_plan import (
    MAX_PART_BYTES,
    ForkPlan,
    part_bodies,
    residue,
    settled_prefix,
)
from runstream.projections.fork_transitions import entry_from_json, entry_json, is_settled
from runstream.projections.memory import MemoryProjection
from runstream.projections.projector import Outcome, Projector
from runstream.projections.replay import replay_run
from runstream.projections.state import (
    MAX_INBOX,
    ChildLink,
    JournalEntry,
    RunState,
    RunStatus,
    Verdict,
    replace,
)
from runstream.projections.store import ProjectionStore
from tests.builders import PartitionLog, Writer, create, request
from tests.unit.placing import placing_count
from tests.unit.test_replay_fixtures import JOURNALS, load

RUN = "fork-1"


def step(position: int, result: Any = None, **fields: Any) -> JournalEntry:
    return JournalEntry(position=position, name=f"s{position}", status="completed",
                        attempts=1, result_json=json.dumps(result or position), **fields)


def source(run_id: str = "src") -> RunState:
    return RunState(run_id=run_id, lineage_id=run_id, partition=0, flow="counted",
                    payload_json='{"tag":"x"}', request_id="r", request_offset=0,
                    created_at_ms=1, updated_at_ms=1, ceiling=("a",), max_rounds=3)


def plan(entries: list[JournalEntry], warnings: tuple[str, ...] = ()) -> ForkPlan:
    return ForkPlan(source(), 7, 42, tuple(entries), warnings)


def parts(entries: list[JournalEntry], *, max_part_bytes: int = MAX_PART_BYTES,
          new_run_id: str = RUN) -> tuple[ev.RunForkPart, ...]:
    return fork_parts_of(plan(entries), new_run_id, forced=False,
                         max_part_bytes=max_part_bytes)


def fork_parts_of(fork: ForkPlan, new_run_id: str, *, forced: bool,
                  max_part_bytes: int = MAX_PART_BYTES) -> tuple[ev.RunForkPart, ...]:
    """The run.fork-part requests the source's owner sends for `fork` (as its outbox does:
    projections.fork_transitions.apply_fork_answered)."""
    return tuple(
        ev.RunForkPart(envelope=Envelope(type=ev.RunForkPart.TYPE, run_id=new_run_id,
                                         lineage_id=new_run_id,
                                         request_id=f"fork/{new_run_id}/n/{body['part']}",
                                         timestamp_ms=1_700_000_000_000),
                       source_run_id=fork.source.run_id,
                       **{k: v for k, v in body.items() if k != "target_run_id"})
        for body in part_bodies(fork, new_run_id, forced=forced, requested_by="test",
                                max_part_bytes=max_part_bytes))


class Log(PartitionLog):
    """One partition folded in memory, with an owner writing decisions about RUN."""

    def __init__(self) -> None:
        super().__init__("owner-a")

    def decide(self, cls: type[Any], writer: Writer | None = None, **body: Any) -> Outcome:
        request_id = body.pop("request_id", None)
        return self.add((writer or self.owner).decide(cls, run_id=RUN, request_id=request_id,
                                                      **body))

    def run(self, run_id: str = RUN) -> RunState:
        return super().run(run_id)

    def owner_decides(self, writer: Writer | None = None) -> list[Outcome]:
        """What the owner decides (projections.decide.fork_decisions), applied in order, one part
        at a time until it has nothing more to decide."""
        store = self.projection.store
        outcomes: list[Outcome] = []
        for _ in range(100):  # parts: a few
            records = fork_decisions(self.run(), lambda p: store.entry(RUN, p))
            if not records:
                return outcomes
            outcomes += [self.decide(cls, writer, **body) for cls, body in records]
        raise AssertionError("the owner never ran out of decisions")


def test_a_fork_is_pending_until_its_owner_copied_every_entry_then_admitted() -> None:
    entries = [step(p, "x" * 300) for p in range(10)]
    requests = parts(entries, max_part_bytes=1500)
    assert len(requests) >= 3 and all(len(encode(r)[0]) <= 1500 for r in requests)
    log = Log()
    for part in requests:
        assert log.add(part).verdict is Verdict.applied
    run = log.run()
    assert (run.status, run.admitted, run.steps) == (RunStatus.pending, False, 0)
    assert run.fork is not None and not run.fork.accepted
    assert (run.flow, run.ceiling, run.max_rounds) == ("counted", ("a",), 3)
    outcomes = log.owner_decides()
    assert [o.verdict for o in outcomes] == [Verdict.applied] * (1 + len(entries))
    forked, copies = outcomes[0], outcomes[1:]
    assert isinstance(forked.record, ev.RunForked) and forked.record.request_offset == 1
    # A copy inside a part leaves the run as it was: the run's state is written per part.
    changed = [o for o in copies if o.run is not o.before]
    assert len(changed) == len(requests)
    run = log.run()
    assert (run.status, run.admitted, run.steps, run.inbox) == (
        RunStatus.pending, True, 10, ())
    assert run.fork is not None and run.fork.accepted and run.fork.source_record == 7
    assert log.projection.journal(RUN) == tuple(entries)


def test_copies_are_idempotent_exact_and_in_order() -> None:
    entries = [step(p) for p in range(4)]
    [whole] = parts(entries)
    log = Log()
    log.add(whole)
    body = {name: getattr(entries[0], name) for name in entries[0].__struct_fields__}
    # Before run.forked nothing is copied.
    assert log.decide(ev.JournalEntryCopied, **body).verdict is Verdict.ignored
    log.owner_decides()  # run.forked and every copy
    assert log.run().admitted
    log2 = Log()
    log2.add(whole)
    store = log2.projection.store
    records = fork_decisions(log2.run(), lambda p: store.entry(RUN, p))
    first_two = records[:3]
    for cls, fields in first_two:
        assert log2.decide(cls, **dict(fields)).verdict is Verdict.applied
    # A re-sent copy (another sequence number), a copy that is not the entry requested, a
    # position past the prefix: all ignored.
    again = dict(records[1][1])
    assert log2.decide(ev.JournalEntryCopied, **again).verdict is Verdict.ignored
    wrong = {**dict(records[3][1]), "result_json": '"forged"'}
    assert log2.decide(ev.JournalEntryCopied, **wrong).verdict is Verdict.ignored
    past = {**dict(records[3][1]), "position": 9}
    assert log2.decide(ev.JournalEntryCopied, **past).verdict is Verdict.ignored
    # A second owner finishes what the first began, copying only what is missing.
    second = Writer("owner-b", epoch=2)
    log2.add(second.claim(0))
    remaining = log2.owner_decides(second)
    assert [o.record.TYPE for o in remaining if o.record] == ["journal.entry-copied"] * 2
    assert log2.run().admitted and log2.projection.journal(RUN) == tuple(entries)
    # The first owner is fenced from then on.
    assert log2.decide(ev.JournalEntryCopied, **again).verdict is Verdict.fenced


def test_parts_that_repeat_do_not_belong_or_are_malformed_change_nothing() -> None:
    entries = [step(p, "y" * 200) for p in range(6)]
    requests = parts(entries, max_part_bytes=1200)
    assert len(requests) >= 3
    log = Log()
    assert log.add(requests[1]).verdict is Verdict.ignored  # no run: part 0 never came
    log.add(requests[0])
    log.add(requests[1])
    resent = dataclasses.replace(requests[1], envelope=dataclasses.replace(
        requests[1].envelope, request_id="another-id"))
    assert log.add(resent).verdict is Verdict.ignored  # that part is held already
    other = dataclasses.replace(requests[2], source_offset=999, envelope=dataclasses.replace(
        requests[2].envelope, request_id="other-fork"))
    assert log.add(other).verdict is Verdict.refused  # a part of another fork
    started = JournalEntry(position=0, name="s0", status="started")
    malformed = dataclasses.replace(requests[2], entries_json=[entry_json(started)],
                                    envelope=dataclasses.replace(requests[2].envelope,
                                                                 request_id="bad"))
    assert log.add(malformed).verdict is Verdict.refused  # an unsettled entry
    again = dataclasses.replace(requests[0], envelope=dataclasses.replace(
        requests[0].envelope, request_id="new-part-0"))
    assert log.add(again).verdict is Verdict.refused  # the run's id is taken
    assert len(log.run().inbox) == 2
    # Copying stops where a part is missing, and goes on once it arrives.
    log.owner_decides()
    held = sum(len(r.entries_json) for r in requests[:2])
    assert log.run().steps == held and not log.run().admitted
    for part in requests[2:]:
        log.add(part)
    log.owner_decides()
    assert log.run().admitted and log.projection.journal(RUN) == tuple(entries)


def test_an_empty_prefix_is_admitted_at_once_and_a_large_payload_leaves_part_0_empty() -> None:
    log = Log()
    [empty] = parts([])
    log.add(empty)
    log.owner_decides()
    assert log.run().admitted and log.run().inbox == () and log.run().steps == 0
    big = dataclasses.replace(plan([step(0), step(1)]), source=replace(
        source(), payload_json=json.dumps("p" * 5000)))
    requests = fork_parts_of(big, "fork-2", forced=True, max_part_bytes=4000)
    assert requests[0].entries_json == [] and len(requests) == 2 and requests[0].forced


def test_cancel_while_copying_and_a_create_rejected_do_not_lose_the_fork() -> None:
    log = Log()
    [whole] = parts([step(0), step(1)])
    log.add(whole)
    log.add(create(RUN, "c1", flow="other"))
    log.decide(ev.RunCreateRejected, request_id="c1", reason="identity-conflict",
               field="flow", existing_value="counted", requested_value="other")
    assert log.run().fork is not None  # the fork stays: its request was not a create
    log.add(request(ev.RunCancelRequested, run_id=RUN, request_id="x", reason="stop"))
    log.decide(ev.RunCancelled, reason="stop")
    run = log.run()
    assert run.status is RunStatus.cancelled and run.inbox == ()
    assert fork_decisions(run, lambda p: None) == []


def test_settled_prefix_stops_at_the_first_unsettled_entry() -> None:
    spawn_done = JournalEntry(position=1, name="child", kind="spawn", status="completed",
                              result_json='"c1"', child_status="completed")
    spawn_open = JournalEntry(position=3, name="child", kind="spawn", status="completed",
                              result_json='"c2"')
    timer = JournalEntry(position=2, name="sleep", kind="sleep", status="completed",
                         result_json="null")
    entries = [step(0), spawn_done, timer, spawn_open, step(4)]
    assert settled_prefix(entries) == (step(0), spawn_done, timer)
    waiting = JournalEntry(position=1, name="sleep", kind="sleep", status="waiting")
    assert settled_prefix([step(0), waiting, step(2)]) == (step(0),)
    assert settled_prefix([step(1)]) == ()  # a gap at position 0
    assert not is_settled(JournalEntry(position=0, name="x", status="retrying"))
    assert entry_from_json(entry_json(spawn_done)) == spawn_done


def test_residue_names_irreversible_steps_and_children_at_or_after_the_prefix() -> None:
    cut = replace(source(), children=(ChildLink("c2", "c2", 3),))
    current = [step(0), step(1, irreversible=True),
               JournalEntry(position=2, name="charge", status="started", irreversible=True),
               JournalEntry(position=3, name="child", kind="spawn", status="completed",
                            result_json='"c2"'),
               JournalEntry(position=4, name="child", kind="spawn", status="completed",
                            result_json='"c3"', child_status="completed")]
    warnings = residue(2, cut, current)
    assert len(warnings) == 3
    assert "'charge' at position 2 was started" in warnings[0]
    assert "c2" in warnings[1] and "still running" in warnings[1]
    assert "c3" in warnings[2] and "spawned" in warnings[2]
    assert residue(5, source(), current) == []


@pytest.mark.parametrize("count", [0, 1, 40])
def test_fork_requests_carry_every_entry_once_in_order(count: int) -> None:
    entries = [step(p, "z" * 100) for p in range(count)]
    requests = parts(entries, max_part_bytes=2000)
    assert [r.part for r in requests] == list(range(len(requests)))
    assert {r.parts for r in requests} == {len(requests)}
    assert {r.entry_count for r in requests} == {count}
    carried = [entry_from_json(t) for r in requests for t in r.entries_json]
    assert carried == entries
    assert len({r.envelope.request_id for r in requests}) == len(requests)
    assert all(r.payload_json == "" for r in requests[1:])


def test_fork_fixture_copies_refusals_duplicates_replay_and_rocksdb_agree(
    tmp_path: Path,
) -> None:
    """Recorded from a real broker by tests/fixtures/record_fork_fixture.py before issue 16
    (a fork request of the first shape carried its prefix): forks after two
    steps, in four parts, at the first record (nothing to copy) and past an irreversible
    step (forced); a request naming an existing run; a part sent twice."""
    memory = MemoryProjection(keep_history=True)
    records = load(JOURNALS / "fork-copies.jsonl")
    store = ProjectionStore(tmp_path / "p", keep_records=True, partitions=placing_count(records))
    projector = Projector(store)
    verdicts: dict[str, list[Verdict]] = {}
    forks = ("fork-two", "fork-parts", "fork-empty", "fork-forced")
    try:
        for partition, offset, record, timestamp_ms in records:
            verdict = memory.apply_record(partition, offset, record, timestamp_ms)
            projector.apply_record(partition, offset, record, timestamp_ms,
                                   raw=encode(record)[0])
            verdicts.setdefault(record.TYPE, []).append(verdict)
        assert {run_id: store.run(run_id) for run_id in memory.runs} == memory.runs
        assert all(store.entries(run_id) == memory.journal(run_id) for run_id in memory.runs)
        # Time travel replays a run's own history: it must give the folded state.
        for run_id in forks:
            run, entries = replay_run(store.history(run_id))
            assert run == memory.runs[run_id]
            assert tuple(entries[p] for p in sorted(entries)) == memory.journal(run_id)
    finally:
        store.close()
    assert sorted(verdicts[ev.RunForkRequested.TYPE]) == sorted(
        [Verdict.applied] * 7 + [Verdict.refused, Verdict.duplicate])
    assert set(verdicts[ev.RunForked.TYPE]) == set(verdicts[ev.JournalEntryCopied.TYPE]) == {
        Verdict.applied}
    runs = memory.runs
    assert {run_id: runs[run_id].status for run_id in forks} == dict.fromkeys(
        forks, RunStatus.completed)
    two, parts_run = runs["fork-two"], runs["fork-parts"]
    assert two.fork is not None and (two.fork.source_run_id, two.fork.entry_count) == ("src", 2)
    assert memory.journal("fork-two")[:2] == memory.journal("src")[:2]
    executed = [i.record.position for i in memory.history["fork-two"]
                if isinstance(i.record, ev.StepCompleted)]
    assert executed == [2, 3]
    assert parts_run.fork is not None and parts_run.fork.parts == 4
    assert memory.journal("fork-parts")[:12] == memory.journal("bulk")[:12]
    copies = [i for i in memory.history["fork-parts"]
              if isinstance(i.record, ev.JournalEntryCopied)]
    assert len(copies) == 12
    assert runs["fork-empty"].fork is not None and runs["fork-empty"].fork.entry_count == 0
    forced = runs["fork-forced"].fork
    assert forced is not None and forced.forced
    assert runs["src"].fork is None  # the refused request changed nothing


def test_a_later_part_joins_a_copying_fork_whose_inbox_other_requests_filled() -> None:
    # Requests sent to the new run while its parts arrive (creates of its id here; updates,
    # forks of it) fill its inbox: a part then still joins (it was ignored, and the fork
    # stayed copying for ever with every request unanswered).
    entries = [step(p, "x" * 300) for p in range(10)]
    requests = parts(entries, max_part_bytes=1500)
    log = Log()
    assert log.add(requests[0]).verdict is Verdict.applied
    for i in range(MAX_INBOX):
        log.add(create(RUN, f"again-{i}"))
    assert len(log.run().inbox) == MAX_INBOX
    for part in requests[1:]:
        assert log.add(part).verdict is Verdict.applied
    outcomes = log.owner_decides()
    assert [o.verdict for o in outcomes] == [Verdict.applied] * (1 + len(entries))
    run = log.run()
    assert run.admitted and run.steps == len(entries)
    # (part 0 held a place while the creates came: the last of them was refused)
    assert [i.type for i in run.inbox] == [ev.RunCreateRequested.TYPE] * (MAX_INBOX - 1)
