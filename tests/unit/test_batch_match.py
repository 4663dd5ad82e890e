"""The batch flow's matching (engine.flow.batch_run._match) over a real read-model store
(RocksDB), folded from journal records written as an owner would:

- a chunk that fills up inside the query's last, short page goes on from there: it was
  reported done, and the rest of the page was never matched (up to 499 runs a batch);
- a lineage that existed when the batch began and handed off since is matched by its live
  round, and the batch's requests are keyed by lineage, so a lineage is acted on once;
- a lineage matched again in a later chunk (it handed off between them) is counted once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runstream.engine.flow import batch_run
from runstream.engine.journal import encode
from runstream.engine.journal import events as ev
from runstream.engine.readmodel.view import View
from runstream.projections.batch import CHUNK, BatchSpec, progress_of
from runstream.projections.projector import Projector
from runstream.projections.store import ProjectionStore
from tests.builders import Writer, create, created

FLOW = "refund"


class Journal:
    """One partition's records folded into a real store as they are written."""

    def __init__(self, path: Path) -> None:
        self.store = ProjectionStore(path, keep_records=True, partitions=1)
        self.projector = Projector(self.store)
        self.owner = Writer("owner")
        self.offset = 0
        self.add(self.owner.claim(0))

    def add(self, record: Any) -> int:
        value, headers = encode(record)
        self.projector.apply_raw(0, self.offset, value, headers, 1_700_000_000_000 + self.offset)
        self.offset += 1
        return self.offset - 1

    def run(self, run_id: str) -> None:
        at = self.add(create(run_id, f"q-{run_id}", flow=FLOW))
        self.add(created(self.owner, run_id, f"q-{run_id}", request_offset=at, flow=FLOW))
        self.add(self.owner.decide(ev.RunActivated, run_id=run_id, mode="new", activation=1))

    def hand_off(self, run_id: str) -> None:
        self.add(self.owner.decide(ev.RunHandedOff, run_id=run_id, next_run_id=f"{run_id}~1",
                                   round=1, payload_json="{}"))


class IO:
    partitions = 1

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def now_ms(self) -> int:
        return 1_000

    async def view(self) -> View:
        self.journal.store.flush()
        return View(self.journal.store, None, 1)

    async def send(self, records: list[Any]) -> None:
        for record in records:
            self.journal.add(record)


async def _matched(journal: Journal, ends: int) -> tuple[list[str], int]:
    after: str | None = None
    ids: list[str] = []
    for chunk in range(1, 100):
        found = batch_run._match(await IO(journal).view(), f"flow = '{FLOW}'", after,
                                 {0: ends}, "batch-x")
        ids += found["ids"]
        after = found["after"]
        if found["done"]:
            return ids, chunk
    raise AssertionError("matching never ended")


async def test_a_chunk_full_inside_the_last_short_page_goes_on_from_there(
        tmp_path: Path) -> None:
    journal = Journal(tmp_path / "store")
    half = CHUNK // 2
    for n in range(half):  # a page of rows half of which are filtered out (round 0s)
        journal.run(f"a-{n:04d}")
        journal.hand_off(f"a-{n:04d}")
    tail = CHUNK - 100
    for n in range(tail):  # then a short page
        journal.run(f"b-{n:04d}")
    ids, chunks = await _matched(journal, journal.offset)
    assert len(ids) == half + tail == len(set(ids)) and chunks == 2, (len(ids), chunks)
    assert ids[-1] == f"b-{tail - 1:04d}"


async def test_a_lineage_that_hands_off_after_the_batch_began_is_matched_once(
        tmp_path: Path) -> None:
    journal = Journal(tmp_path / "store")
    for n in range(3):
        journal.run(f"c-{n}")
    ends = journal.offset  # the batch's `ends` step
    journal.hand_off("c-1")  # after it: round 1's own creation is past `ends`
    journal.run("late")  # created after the batch began: not matched
    ids, _ = await _matched(journal, ends)
    assert ids == ["c-0", "c-1~1", "c-2"], ids
    spec = BatchSpec(batch_id="b1", operation="cancel", where=f"flow = '{FLOW}'")
    # (one lineage, one request id: a second action on it is the partition's duplicate)
    assert (batch_run._request(spec, "c-1~1", None, 0).envelope.request_id
            == batch_run._request(spec, "c-1", None, 0).envelope.request_id)


async def test_a_lineage_matched_again_after_a_handoff_counts_once(tmp_path: Path) -> None:
    """Matched in one chunk, it handed off before the next matched its new round: the second
    request (the same id: keyed by lineage) is the partition's duplicate. It counted as done
    a second time, and the lineage as matched twice."""
    journal = Journal(tmp_path / "store")
    journal.run("c-1")
    spec = BatchSpec(batch_id="b1", operation="signal", where=f"flow = '{FLOW}'",
                     signal="go")
    first = await batch_run._send(IO(journal), spec, None, ["c-1"])
    journal.hand_off("c-1")
    second = await batch_run._send(IO(journal), spec, None, ["c-1~1"])
    assert (first["sent"], first["done"], first["again"]) == (1, 1, 0)
    assert (second["sent"], second["done"], second["again"], second["refused"]) == (0, 0, 1, [])
    progress = progress_of(spec, [("match-1", {"ids": ["c-1"], "done": False}),
                                  ("send-1", first),
                                  ("match-2", {"ids": ["c-1~1"], "done": True}),
                                  ("send-2", second)])
    assert (progress.matched, progress.sent, progress.done, progress.refused) == (1, 1, 1, 0)
