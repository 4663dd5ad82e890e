"""Issue 16, item 12, without a broker: a fork request carries no journal content (the
source's owner answers it from its own journal, and only an owner's run.fork-part makes the
new run), and a relayed authority acts only on runs its capabilities cover."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from runstream.engine.errors import RunFailed
from runstream.engine.journal import decode, encode
from runstream.engine.journal import events as ev
from runstream.engine.testing import TestEnvironment
from runstream.engine.worker.relay_judge import AUTHORITY_HEADER, Forward, Incoming, Refuse, judge
from runstream.projections.decide import FIRST_SHAPE_FORK, fork_decisions
from runstream.projections.fork_plan import ForkNeedsForce, answer_fork, within_limits
from runstream.projections.fork_transitions import ForkAsk, entry_json, fork_asks
from runstream.projections.memory import MemoryProjection
from runstream.projections.partitioning import run_partition
from runstream.projections.projector import Outcome, Projector
from runstream.projections.requests import covers, describe_refusal
from runstream.projections.state import (
    MAX_INBOX,
    JournalEntry,
    RunState,
    RunStatus,
    Verdict,
    replace,
)
from runstream.projections.store import ProjectionStore
from runstream.projections.values import HistoryEntry
from tests.builders import PartitionLog, create, request
from tests.integration.fork_flows import flows as fork_flows
from tests.integration.fork_flows import relayed, risky
from tests.unit.placing import placing_count
from tests.unit.test_replay_fixtures import JOURNALS, load

NS = "ns"
PARTITIONS = 3
SHOP = {"authority": "shop", "authority_capabilities": ["email"]}


class Log(PartitionLog):
    """One partition folded in memory, with one owner."""

    def made(self, run_id: str, ceiling: list[str] | None) -> RunState:
        """An admitted run with `ceiling`."""
        self.add(dataclasses.replace(create(run_id, f"c-{run_id}"), ceiling=ceiling))
        self.add(self.owner.decide(ev.RunCreated, run_id=run_id, request_id=f"c-{run_id}",
                                   flow="checkout", payload_json='{"amount":5}',
                                   request_offset=self.offset - 1, ceiling=ceiling))
        return self.run(run_id)


def ask(source: str = "src", target: str = "copy", request_id: str = "f1",
        **fields: Any) -> ev.RunForkRequested:
    body = {"source_run_id": source, "source_offset": 3, "source_record": 2,
            "target_run_id": target, "requested_by": "me", **fields}
    record: ev.RunForkRequested = request(ev.RunForkRequested, run_id=source,
                                          request_id=request_id, **body)
    return record


def answered(log: Log, part: int, parts: int, *, request_id: str = "f1",
             target: str = "copy", **fields: Any) -> Outcome:
    body = {"target_run_id": target, "source_offset": 3, "source_record": 2,
            "flow": "checkout", "payload_json": '{"amount":5}', "entry_count": parts,
            "part": part, "parts": parts, "requested_by": "me",
            "entries_json": [entry_json(JournalEntry(position=part, name=f"s{part}",
                                                     status="completed", attempts=1,
                                                     result_json="1"))], **fields}
    return log.add(log.owner.decide(ev.RunForkAnswered, run_id="src", request_id=request_id,
                                    **body))


# -- authorities -----------------------------------------------------------------------------

def _run(ceiling: tuple[str, ...] | None) -> RunState:
    return RunState(run_id="r", lineage_id="r", partition=0, flow="f", payload_json="null",
                    request_id="q", request_offset=0, created_at_ms=1, updated_at_ms=1,
                    ceiling=ceiling)


@pytest.mark.parametrize(("authority", "capabilities", "ceiling", "expected"), [
    (None, [], None, True),  # unrestricted: any run
    (None, [], ("payments",), True),
    ("shop", ["email"], None, False),  # a run that may use anything: no restricted one
    ("shop", ["email"], ("email",), True),
    ("shop", ["email", "sms"], ("email",), True),  # a subset
    ("shop", ["email"], (), True),  # a run that may use nothing
    ("shop", ["email"], ("email", "payments"), False),
    ("shop", [], ("email",), False),
])
def test_an_authority_covers_a_run_whose_ceiling_is_a_subset_of_its_capabilities(
        authority: str | None, capabilities: list[str], ceiling: tuple[str, ...] | None,
        expected: bool) -> None:
    signal = request(ev.RunSignalSent, run_id="r", request_id="s", name="go",
                     authority=authority, authority_capabilities=capabilities)
    assert covers(signal, _run(ceiling)) is expected


def test_an_authority_may_signal_cancel_resume_and_fork_only_runs_it_covers() -> None:
    log = Log()
    log.made("src", None)
    log.made("mine", ["email"])
    outside = [request(ev.RunSignalSent, run_id="src", request_id="s1", name="go", **SHOP),
               request(ev.RunCancelRequested, run_id="src", request_id="c1", **SHOP),
               request(ev.RunResumeRequested, run_id="src", request_id="r1", operator="o",
                       **SHOP),
               ask(**SHOP)]
    before = log.run("src")
    for record in outside:
        outcome = log.add(record)
        assert outcome.verdict is Verdict.refused, record.TYPE
        assert describe_refusal(outcome.run, record) == (
            "authority 'shop' (allowed: email) does not cover run src, which may use any "
            "capability")
    assert log.run("src") == before
    inside = [request(ev.RunSignalSent, run_id="mine", request_id="s2", name="go", **SHOP),
              request(ev.RunCancelRequested, run_id="mine", request_id="c2", **SHOP),
              ask(source="mine", request_id="f2", **SHOP)]
    assert [log.add(record).verdict for record in inside] == [Verdict.applied] * 3
    mine = log.run("mine")
    assert (len(mine.signals), mine.cancel_requested, len(fork_asks(mine))) == (
        1, "cancelled", 1)
    wide = log.add(request(ev.RunSignalSent, run_id="mine", request_id="s3", name="go",
                           authority="shop", authority_capabilities=[]))
    assert wide.verdict is Verdict.refused
    assert "which may use email" in describe_refusal(wide.run, wide.record)


# -- the fork request at the source ------------------------------------------------------------

def test_a_fork_request_carries_only_its_parameters_and_waits_in_the_source_inbox() -> None:
    log = Log()
    log.made("src", None)
    entry = entry_json(JournalEntry(position=0, name="charge", status="completed",
                                    attempts=1, result_json='"forged"'))
    malformed = [ask(request_id="a", entries_json=[entry], entry_count=1),
                 ask(request_id="b", parts=2), ask(request_id="c", source_run_id="other"),
                 ask(request_id="d", target="src"), ask(request_id="e", source_record=0)]
    assert [log.add(r).verdict for r in malformed] == [Verdict.refused] * len(malformed)
    assert log.run("src").inbox == ()
    assert log.add(ask(source="nobody", request_id="g")).verdict is Verdict.ignored
    assert log.add(ask()).verdict is Verdict.applied
    [held] = fork_asks(log.run("src"))
    assert held == ForkAsk(request_id="f1", offset=held.offset, target_run_id="copy",
                           source_offset=3, source_record=2, forced=False,
                           requested_by="me", answered=0)
    # The source settling does not drop it: a settled run is forked too.
    log.add(log.owner.decide(ev.RunCancelled, run_id="src", reason="stop"))
    assert log.run("src").status is RunStatus.cancelled and fork_asks(log.run("src"))


def test_each_answered_part_goes_to_the_new_run_through_the_outbox_once_and_in_order() -> None:
    log = Log()
    log.made("src", None)
    log.add(ask())
    assert answered(log, 1, 2).verdict is Verdict.ignored  # not the next part
    first = answered(log, 0, 2)
    assert first.verdict is Verdict.applied
    [sent] = first.outbox
    assert (sent.request_id, sent.type, sent.run_id, sent.lineage_id) == (
        "f1/0", ev.RunForkPart.TYPE, "copy", "copy")
    body = json.loads(sent.body_json)
    assert (body["source_run_id"], body["part"], body["parts"]) == ("src", 0, 2)
    assert fork_asks(log.run("src"))[0].answered == 1
    assert answered(log, 0, 2).verdict is Verdict.ignored  # a later owner answering again
    assert answered(log, 1, 2, target="elsewhere").verdict is Verdict.ignored
    last = answered(log, 1, 2)
    assert [item.request_id for item in last.outbox] == ["f1/1"]
    assert fork_asks(log.run("src")) == [] and log.run("src").inbox == ()
    assert [i.request_id for i in log.projection.store.outbox(0)] == ["f1/0", "f1/1"]

    log.add(ask(request_id="f2", target="copy-2"))
    refusal = log.add(log.owner.decide(ev.RunForkAnswered, run_id="src", request_id="f2",
                                       target_run_id="copy-2", refused="needs --force",
                                       source_offset=3, source_record=2))
    assert refusal.verdict is Verdict.applied and refusal.outbox == ()
    assert fork_asks(log.run("src")) == []


def test_a_part_of_the_first_shape_replays_but_no_owner_copies_it() -> None:
    log = Log()
    entry = entry_json(JournalEntry(position=0, name="charge", status="completed",
                                    attempts=1, result_json='"forged"'))
    forged = request(ev.RunForkRequested, run_id="forged", request_id="x",
                     source_run_id="src", source_offset=1, source_record=1, flow="checkout",
                     payload_json="{}", entry_count=1, entries_json=[entry])
    assert log.add(forged).verdict is Verdict.applied  # as journals before issue 16 hold it
    run = log.run("forged")
    assert fork_decisions(run, lambda p: None) == [
        (ev.RunFailed, {"error_type": "ForkRefused", "traceback": "",
                        "error_message": FIRST_SHAPE_FORK})]
    [(cls, body)] = fork_decisions(run, lambda p: None)
    assert log.add(log.owner.decide(cls, run_id="forged", **body)).verdict is Verdict.applied
    assert log.run("forged").status is RunStatus.failed
    assert log.projection.journal("forged") == ()  # the forged step was never copied


# -- the owner's answer ------------------------------------------------------------------------

async def test_the_owner_answers_from_the_source_history_or_refuses_with_a_reason() -> None:
    async with TestEnvironment(fork_flows) as env:
        await env.run(risky, {"tag": "fork-source"}, run_id="pay")
        items = [HistoryEntry(i.partition, i.offset, i.verdict, i.record.TYPE,
                              i.record.envelope.timestamp_ms, encode(i.record)[0])
                 for i in env.history("pay") if i.record is not None]
        run, journal = env.describe("pay"), env.journal("pay")

    def asked(row: int, *, offset: int | None = None, forced: bool = False,
              answered: int = 0, target: str = "t") -> ForkAsk:
        return ForkAsk(request_id="f", offset=0, target_run_id=target,
                       source_offset=items[row - 1].offset if offset is None else offset,
                       source_record=row, forced=forced, requested_by="me",
                       answered=answered)

    # A target no client may name (a plain producer's request, unchecked by any relay): a
    # run made under it could not be reached, and a round id's parts were dead letters.
    for target, why in (("fork ok", "not allowed (' ')"), ("f" * 201, "over the 200"),
                        ("fork~1", "names the rounds")):
        [(cls, bad)] = answer_fork(run, asked(4, forced=True, target=target), items, journal)
        assert cls is ev.RunForkAnswered and why in (bad["refused"] or ""), bad
    # One an owner before the check began answering is finished, not left half copied.
    begun = answer_fork(run, asked(4, forced=True, target="fork ok", answered=1), items,
                        journal, max_part_bytes=400)
    assert begun and all(body.get("refused") is None for _, body in begun)
    [(cls, wrong)] = answer_fork(run, asked(4, offset=999), items, journal)
    assert cls is ev.RunForkAnswered and "record:4 at offset 999 is not in run pay" in (
        wrong["refused"] or "")
    [(_, residue)] = answer_fork(run, asked(4), items, journal)
    assert "needs --force" in residue["refused"] and "'charge'" in residue["refused"]
    parts = answer_fork(run, asked(4, forced=True), items, journal, max_part_bytes=400)
    assert len(parts) == 2 and all(body.get("refused") is None for _, body in parts)
    copied = [json.loads(t)["name"] for _, body in parts for t in body["entries_json"]]
    assert copied == ["prepare"] and {b["request_id"] for _, b in parts} == {"f"}
    assert answer_fork(run, asked(4, forced=True, answered=1), items, journal,
                       max_part_bytes=400) == parts[1:]


async def test_a_fork_of_a_round_before_its_handoff_weighs_the_later_rounds() -> None:
    """Forking round 0 before its handoff: the fork's round 1 charges again. The client's
    plan and the owner's answer both saw round 0's journal alone."""
    async with TestEnvironment(fork_flows) as env:
        await env.run(relayed, {"tag": "later"}, run_id="lin")
        row = next(k for k, i in enumerate(env.history("lin"), 1)
                   if isinstance(i.record, ev.StepCompleted) and i.record.name == "prepare")
        with pytest.raises(ForkNeedsForce, match="later round lin~1"):
            await env.fork("lin", at_record=row)
        items = [HistoryEntry(i.partition, i.offset, i.verdict, i.record.TYPE,
                              i.record.envelope.timestamp_ms, encode(i.record)[0])
                 for i in env.history("lin") if i.record is not None]
        run = env.describe("lin~0")
        ask = ForkAsk(request_id="f", offset=0, target_run_id="t", forced=False,
                      source_offset=items[row - 1].offset, source_record=row,
                      requested_by="me", answered=0)
        [(_, refused)] = answer_fork(run, ask, items, env.journal("lin"),
                                     later=env.later_rounds(run))
        assert "needs --force" in (refused["refused"] or "") and "lin~1" in refused["refused"]


# -- the relay ---------------------------------------------------------------------------------

def _incoming(record: Any, topic: str = f"{NS}.requests") -> Incoming:
    value, headers = encode(record)
    run_id = record.envelope.run_id
    return Incoming(topic, run_partition(run_id, PARTITIONS), 7, run_id.encode(), value,
                    tuple(headers))


def _judge(record: Any, topic: str = f"{NS}.requests") -> Forward | Refuse:
    return judge(_incoming(record, topic), NS, {"shop": frozenset({"email"})}, PARTITIONS)


def test_the_relay_sets_the_authority_strips_a_forged_one_and_refuses_fork_content() -> None:
    forged = request(ev.RunSignalSent, run_id="r1", request_id="s", name="go",
                     authority="admin", authority_capabilities=["everything"])
    plain = _judge(forged)
    assert isinstance(plain, Forward)
    assert decode(plain.value).authority is None  # type: ignore[attr-defined]
    assert all(k != AUTHORITY_HEADER for k, _ in plain.headers)
    for record in (forged, ask(source="r1"),
                   request(ev.RunCancelRequested, run_id="r1", request_id="c")):
        tagged = _judge(record, f"{NS}.requests.shop")
        assert isinstance(tagged, Forward)
        carried = decode(tagged.value)
        assert (carried.authority, carried.authority_capabilities) == (  # type: ignore
            "shop", ["email"])
    entry = entry_json(JournalEntry(position=0, name="charge", status="completed",
                                    attempts=1, result_json='"forged"'))
    first_shape = request(ev.RunForkRequested, run_id="copy", request_id="x",
                          source_run_id="r1", source_offset=1, source_record=1,
                          entry_count=1, entries_json=[entry])
    part = request(ev.RunForkPart, run_id="copy", request_id="y", source_run_id="r1",
                   source_offset=1, source_record=1, flow="f", payload_json="{}",
                   entry_count=1, entries_json=[entry])
    carrying = ask(source="r1", entries_json=[entry], entry_count=1)
    for record in (first_shape, part, carrying):
        for topic in (f"{NS}.requests", f"{NS}.requests.shop"):
            refused = _judge(record, topic)
            assert isinstance(refused, Refuse), (record.TYPE, topic)
            assert refused.reason.startswith("not a client request"), refused.reason
    elsewhere = _judge(ask(source="r1", source_run_id="r2"))
    assert isinstance(elsewhere, Refuse) and "goes to its source run r2" in elsewhere.reason
    bad_target = _judge(ask(source="r1", target="bad id!"))
    assert isinstance(bad_target, Refuse) and bad_target.reason.startswith("invalid input")


# -- the committed fixture ---------------------------------------------------------------------

def test_fork_source_owner_fixture_replays_and_rocksdb_agrees(tmp_path: Path) -> None:
    """Recorded from a real broker by tests/fixtures/record_fork_fixture.py: each fork is
    one request at its source, answered by the source's owner in parts that reach the new
    run as run.fork-part; a fork needing force refused by that owner, one from an authority
    that does not cover its source refused by the reducer, one sent twice, and one naming a
    run that exists."""
    memory = MemoryProjection(keep_history=True)
    records = load(JOURNALS / "fork-source-owner.jsonl")
    store = ProjectionStore(tmp_path / "p", keep_records=True, partitions=placing_count(records))
    projector = Projector(store)
    verdicts: dict[str, list[Verdict]] = {}
    try:
        for partition, offset, record, timestamp_ms in records:
            verdict = memory.apply_record(partition, offset, record, timestamp_ms)
            projector.apply_record(partition, offset, record, timestamp_ms,
                                   raw=encode(record)[0])
            verdicts.setdefault(record.TYPE, []).append(verdict)
        assert {run_id: store.run(run_id) for run_id in memory.runs} == memory.runs
        assert all(store.entries(run_id) == memory.journal(run_id) for run_id in memory.runs)
        for p in sorted(memory.partitions):
            assert store.outbox(p) == memory.store.outbox(p) == []  # every part was sent
    finally:
        store.close()
    assert sorted(verdicts[ev.RunForkRequested.TYPE]) == sorted(
        [Verdict.applied] * 7 + [Verdict.refused, Verdict.duplicate])
    assert set(verdicts[ev.RunForkAnswered.TYPE]) == {Verdict.applied}
    assert sorted(verdicts[ev.RunForkPart.TYPE]) == sorted(
        [Verdict.applied] * (len(verdicts[ev.RunForkPart.TYPE]) - 1) + [Verdict.refused])
    runs = memory.runs
    forks = ("fork-two", "fork-parts", "fork-empty", "fork-forced", "fork-twice")
    assert {run_id: runs[run_id].status for run_id in forks} == dict.fromkeys(
        forks, RunStatus.completed)
    assert "fork-unforced" not in runs and "fork-foreign" not in runs
    parts = runs["fork-parts"].fork
    assert parts is not None and parts.parts > 2 and parts.entry_count == 12
    assert memory.journal("fork-parts")[:12] == memory.journal("bulk")[:12]
    refusals = [i.record.refused for i in memory.history["pay"]
                if isinstance(i.record, ev.RunForkAnswered) and i.record.refused]
    assert len(refusals) == 1 and "needs --force" in refusals[0]
    for run_id in ("src", "bulk", "pay"):
        assert fork_asks(runs[run_id]) == []  # every fork request was answered


async def test_a_fork_cut_before_the_source_s_limits_were_fixed_gets_them_all_the_same() -> None:
    """A run created by name is admitted with its flow's ceiling; a fork cut at its create
    request (before run.created) must not start with the request's limits (none)."""
    from tests.integration.lifetime_flows import capped, flows, looper

    async with TestEnvironment(flows) as env:
        for flow, payload in ((capped, None), (looper, {"n": 0})):
            run_id = await env.start(flow.name, payload)
            with pytest.raises(RunFailed):
                await env.result(run_id, follow=True)
            items = [HistoryEntry(i.partition, i.offset, i.verdict, i.record.TYPE,
                                  i.record.envelope.timestamp_ms, encode(i.record)[0])
                     for i in env.history(run_id) if i.record is not None]
            at_request = ForkAsk(request_id="f", offset=0, target_run_id="t",
                                 source_offset=items[0].offset, source_record=1,
                                 forced=True, requested_by="me", answered=0)
            [(_, body)] = answer_fork(env.describe(run_id), at_request, items,
                                      env.journal(run_id))
            assert body.get("refused") is None
            assert (body["ceiling"], body["max_rounds"]) == (
                list(env.describe(run_id).ceiling or []) or None,
                env.describe(run_id).max_rounds or None)
        assert env.describe(run_id).max_rounds == 3


def test_within_limits_takes_the_narrower_ceiling_and_budget() -> None:
    cut = _run(None)
    now = replace(_run(("payments.read",)), max_rounds=3)
    narrowed = within_limits(cut, now)
    assert (narrowed.ceiling, narrowed.max_rounds) == (("payments.read",), 3)
    wide = within_limits(replace(_run(("a", "b")), max_rounds=5), replace(_run(("b", "c")),
                                                                         max_rounds=2))
    assert (wide.ceiling, wide.max_rounds) == (("b",), 2)


def test_a_restricted_authority_may_not_resolve_a_quarantine() -> None:
    for resolution in ("retry", "skip"):
        resume = request(ev.RunResumeRequested, run_id="r1", request_id=f"q-{resolution}",
                         operator="shop", resolution=resolution, position=0, digest="d",
                         result_json="1" if resolution == "skip" else None)
        refused = _judge(resume, f"{NS}.requests.shop")
        assert isinstance(refused, Refuse) and "an operator's request" in refused.reason
    plain = request(ev.RunResumeRequested, run_id="r1", request_id="wake", operator="shop")
    assert isinstance(_judge(plain, f"{NS}.requests.shop"), Forward)


def test_a_fork_ask_to_a_source_with_a_full_inbox_is_refused_with_a_reason() -> None:
    log = Log()
    log.made("src", None)
    for i in range(MAX_INBOX):
        log.add(create("src", f"again-{i}"))
    asked = ask(source="src")
    assert log.add(asked).verdict is Verdict.refused
    assert "the most it keeps" in describe_refusal(log.run("src"), asked)


async def test_a_fork_of_a_cancelled_run_ends_its_prefix_where_the_cancel_was_delivered() -> None:
    """The fork has no cancel: what the source journaled from the delivery on was the
    cancel's cleanup, not copied (a copied Cancelled entry would replay as a failure)."""
    from runstream.projections.fork_plan import plan_fork
    from tests.integration.lifetime_flows import flows, tidy

    async with TestEnvironment(flows) as env:
        run_id = await env.start(tidy, {"cleanup_sleep": 0})
        await env.run_until_idle()
        await env.cancel(run_id)
        await env.run_until_idle()
        source = env.describe(run_id)
        assert source.cancel_delivered_at == 0
        items = [HistoryEntry(i.partition, i.offset, i.verdict, i.record.TYPE,
                              i.record.envelope.timestamp_ms, encode(i.record)[0])
                 for i in env.history(run_id) if i.record is not None]
        plan = plan_fork(run_id, items, len(items), env.journal(run_id))
        assert plan.prefix == ()


async def test_the_environment_forks_a_later_round_as_a_worker_does() -> None:
    """The in-memory projection kept a handoff only in the round that handed off: a later
    round's history lacked the item (with the state it made) a replay starts the round
    from, and env.fork('x~1') failed where the CLI's fork of the same round worked."""
    async with TestEnvironment(fork_flows) as env:
        assert await env.run(relayed, {"tag": "env-round"}, run_id="x") is not None
        assert [i.type for i in env.history("x~1")][:2] == ["run.handed-off", "run.activated"]
        row = next(k for k, i in enumerate(env.history("x~1"), 1)
                   if i.type == "run.activated")
        copy = await env.fork("x~1", at_record=row, new_run_id="x1-copy", force=True)
        assert await env.result(copy) == "charge:env-round"
