"""projections.request_reuse: a create repeating its partition's request id for a run that
does not exist is rejected by the one owner path, which the TestEnvironment runs too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runstream import RunNotFound
from runstream.engine.client.answers import answer_in
from runstream.engine.journal import JournalRecord, encode
from runstream.engine.journal import events as ev
from runstream.engine.readmodel.view import View
from runstream.engine.testing import TestEnvironment
from runstream.projections.owner import on_record
from runstream.projections.projector import Projector
from runstream.projections.reactions import Write
from runstream.projections.request_reuse import REQUEST_ID_REUSED, reused_key, reused_rejection
from runstream.projections.state import Verdict
from runstream.projections.store import ProjectionStore
from tests.builders import Writer, create, request
from tests.unit.test_owner_reactions import a_run, capped, view


def test_a_repeated_create_naming_no_run_is_rejected_once_on_its_partition() -> None:
    record = create("r2", "q1", flow=capped.name)
    [write] = on_record(view(), None, record, Verdict.duplicate, offset=9, partition=3)
    assert isinstance(write, Write) and write.key == reused_key("q1", 9)
    assert (write.run.run_id, write.run.partition) == ("r2", 3)
    [(cls, body)] = write.records
    assert cls is ev.RunCreateRejected
    assert (body["request_id"], body["reason"], body["field"]) == ("q1", REQUEST_ID_REUSED,
                                                                   "request_id")
    assert "applied before on partition 3" in str(body["requested_value"])
    # Once per ownership; and not while the first request's own answer is in flight.
    assert on_record(view(decided=frozenset({reused_key("q1", 9)})), None, record,
                     Verdict.duplicate, offset=9, partition=3) == []
    assert on_record(view(decided=frozenset({"q1"})), None, record, Verdict.duplicate,
                     offset=9, partition=3) != []


def test_a_repeat_of_a_run_that_exists_or_of_another_request_type_is_left_alone() -> None:
    record = create("r1", "q1", flow=capped.name)
    assert on_record(view(), a_run(), record, Verdict.duplicate, offset=9, partition=0) == []
    signal = request(ev.RunSignalSent, run_id="r2", request_id="q1", name="go",
                     payload_json="null")
    assert on_record(view(), None, signal, Verdict.duplicate, offset=9, partition=0) == []


async def test_the_environment_rejects_it_and_says_so_where_the_run_is_asked_for() -> None:
    async with TestEnvironment([capped]) as env:
        body = {"flow": capped.name, "payload_json": '{"amount":5}'}
        assert env.log.request(ev.RunCreateRequested, "a", request_id="q", **body) \
            is Verdict.applied
        assert env.log.request(ev.RunCreateRequested, "b", request_id="q", **body) \
            is Verdict.duplicate
        await env.run_until_idle()
        assert await env.result("a") == 5
        with pytest.raises(RunNotFound, match=r"its create was rejected \(request-id-reused: "
                           r"request id 'q' was applied before on partition 0.*its records: "
                           r"runstream partition history 0$"):
            await env.result("b")
        with pytest.raises(RunNotFound, match="check the id"):
            env.describe("c")
        # After many more records of the partition, as a worker's readers: it read only the
        # partition's newest 256.
        for n in range(300):
            env.log.request(ev.RunCreateRequested, f"more-{n}", request_id="q", **body)
        with pytest.raises(RunNotFound, match="request-id-reused"):
            env.describe("b")
        # The id stays free for a create of its own.
        await env.start(capped, {"amount": 7}, run_id="b")
        await env.run_until_idle()
        assert await env.result("b") == 7


class Log:
    """Partition 0 of a read model's RocksDB store, folded record by record."""

    def __init__(self, path: Path) -> None:
        self.store = ProjectionStore(path, keep_records=True, partitions=1)
        self.projector, self.offset, self.now = Projector(self.store), 0, 1_800_000_000_000
        self.owner = Writer("owner")
        self.add(self.owner.claim(0, owner="owner"))

    def add(self, record: JournalRecord) -> Verdict:
        self.now += 1
        value, headers = encode(record)
        verdict = self.projector.apply_raw(0, self.offset, value, headers, self.now).verdict
        self.offset += 1
        return verdict

    def reused_create(self, run_id: str) -> None:
        assert self.add(create(run_id, "shared")) is Verdict.duplicate

    def view(self) -> View:
        self.store.flush()
        return View(self.store, None, 1)


@pytest.fixture
def log(tmp_path: Path) -> Iterator[Log]:
    made = Log(tmp_path / "store")
    offset = made.offset
    made.add(create("first", "shared"))
    made.add(made.owner.decide(ev.RunCreated, run_id="first", request_id="shared",
                               flow="checkout", payload_json="{}", request_offset=offset,
                               incarnation=offset))
    yield made
    made.store.close()


def test_a_reader_takes_its_owner_s_answer_not_a_deposed_one_s(log: Log) -> None:
    log.reused_create("x")
    answered = log.offset
    log.add(log.owner.decide(ev.RunCreateRejected, run_id="x", **reused_rejection("shared", 0)))
    found = log.view().reuse_rejection("x")
    assert found is not None and found[0].offset == answered  # (the owner's own record)
    log.reused_create("y")
    repeated = log.offset - 1
    log.add(Writer("owner2", epoch=2).claim(0, owner="owner2"))
    assert log.add(log.owner.decide(ev.RunCreateRejected, run_id="y",
                                    **reused_rejection("shared", 0))) is Verdict.fenced
    # The deposed owner's is not taken: the readers judge the repeat as an owner would.
    found = log.view().reuse_rejection("y")
    assert found is not None and found[0].offset == repeated
    assert found[1].envelope.run_id == "y" and found[1].reason == "request-id-reused"


def test_a_repeat_no_owner_answered_is_judged_by_its_readers(log: Log) -> None:
    """Sent while no owner executed the partition, a repeated create is answered by none
    (nor by the next owner's sweep: it left no run, no inbox); a reader judges it from its
    verdict, as the owner would have."""
    log.reused_create("z")
    answer = answer_in(log.view(), "created:z", "z", 0, 0)
    assert answer is not None and isinstance(answer.record, ev.RunCreateRejected)
    assert (answer.record.reason, answer.record.envelope.request_id) == (REQUEST_ID_REUSED,
                                                                        "shared")
    assert answer.offset == log.offset - 1 and answer_in(log.view(), "created:z", "z", 0,
                                                         log.offset) is None
    assert log.view().reuse_rejection("never-sent") is None


def test_a_later_repeat_naming_the_run_does_not_hide_its_answer(log: Log) -> None:
    log.reused_create("x")
    answered = log.offset
    log.add(log.owner.decide(ev.RunCreateRejected, run_id="x", **reused_rejection("shared", 0)))
    assert log.add(request(ev.RunSignalSent, run_id="x", request_id="shared", name="go",
                           payload_json="1")) is Verdict.duplicate
    found = answer_in(log.view(), "created:x", "x", 0, 0)
    assert found is not None and found.offset == answered
    assert isinstance(found.record, ev.RunCreateRejected)
