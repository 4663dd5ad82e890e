"""Time travel against a real broker: the state at every record of a run's history (its
rounds and children included) equals what a live projection held at that moment; the tree,
`run at --record`, and `run diff`."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition

from runstream import Client, Worker
from runstream.engine.config import journal_topic
from runstream.engine.kafka.reader import partition_count, reader_consumer
from runstream.engine.readmodel.model import ReadModel
from runstream.engine.timetravel.points import Point, run_at, run_diff, run_tree
from runstream.projections.memory import MemoryProjection
from runstream.projections.replay import iso
from runstream.projections.state import JournalEntry, RunState
from tests.integration.test_cli import cli, one_line_error
from tests.integration.timetravel_flows import flows, traveller

WATCHED = ("tt", "tt~1", "tt-kid")
Snapshot = tuple[RunState | None, tuple[JournalEntry, ...]]


class LiveTail:
    """Folds the journal while the test runs and keeps, after every record, the state of
    each watched run (bounded: the test's few hundred records x WATCHED)."""

    def __init__(self, bootstrap: str, namespace: str) -> None:
        self.bootstrap, self.topic = bootstrap, journal_topic(namespace)
        self.projection = MemoryProjection(keep_history=False)
        self.seen: dict[tuple[str, int, int], Snapshot] = {}  # (run, partition, offset)
        self._task: asyncio.Task[None] | None = None

    @asynccontextmanager
    async def running(self) -> AsyncIterator[LiveTail]:
        consumer = reader_consumer(self.bootstrap, client_id="timetravel-test-tail")
        await consumer.start()
        partitions = await partition_count(consumer, self.topic, self.bootstrap)
        consumer.assign([TopicPartition(self.topic, p) for p in range(partitions)])
        self._task = asyncio.create_task(self._follow(consumer))
        try:
            yield self
        finally:
            await asyncio.sleep(1.0)  # the last records reach the tail
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            await consumer.stop()

    async def _follow(self, consumer: Any) -> None:
        while True:
            batches = await consumer.getmany(timeout_ms=100)
            for messages in batches.values():
                for m in messages:
                    self.projection.apply_raw(m.partition, m.offset, m.value, m.headers,
                                              m.timestamp, key=m.key)
                    for run_id in WATCHED:
                        self.seen[(run_id, m.partition, m.offset)] = (
                            self.projection.runs.get(run_id), self.projection.journal(run_id))


@asynccontextmanager
async def traveller_done(bootstrap: str, namespace: str, tmp_path: Path
                         ) -> AsyncIterator[Client]:
    """Run `tt` (a sleep, a signal, a child, a handoff) to its end; the worker and a client
    stay up inside the block."""
    worker = Worker(flows=flows, data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
                    namespace=namespace, session_timeout_ms=6000)
    await worker.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=flows) as client:
            handle = await client.create_run(traveller, {}, run_id="tt")
            await client.signal("tt", "go", 2)
            assert await handle.result(timeout=60, follow=True) == 7  # (1 + 2) * 2 + 1
            yield client
    finally:
        await worker.stop()


async def test_state_at_every_record_equals_the_live_projection_then(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    tail = LiveTail(bootstrap, namespace)
    async with tail.running():
        async with traveller_done(bootstrap, namespace, tmp_path):
            pass
    async with ReadModel(bootstrap=bootstrap, topic=journal_topic(namespace),
                         path=tmp_path / "rm") as model:
        view = await model.catch_up()
        tree = run_tree(view, "tt")
        nodes = [tree.roots[0], *tree.roots[0].children, *tree.roots[1:]]
        assert [(n.run_id, n.relation) for n in nodes] == [
            ("tt", "run"), ("tt-kid", "child"), ("tt~1", "round")]
        # The next round's time travel starts from the state stored with its first item.
        assert view.history("tt~1")[0].seed is not None
        assert all(item.seed is None for item in view.history("tt"))
        checked = 0
        for node in nodes:
            for number, row in enumerate(node.rows, start=1):
                live_run, live_entries = tail.seen[(node.run_id, row.partition, row.offset)]
                if live_run is None:  # not created yet (e.g. a create request's row)
                    continue
                past = run_at(view, node.run_id, Point("record", number))
                assert past.run == live_run, (node.run_id, number, row.type)
                assert past.entries == live_entries, (node.run_id, number, row.type)
                checked += 1
        types = {row.type for node in nodes for row in node.rows}
        assert {"timer.fired", "run.signal-sent", "child.spawned", "run.handed-off",
                "run.wake-requested"} <= types
        assert checked >= 20
        _check_diff(view)


def _check_diff(view: Any) -> None:
    items = view.history("tt")
    suspended = next(n for n, item in enumerate(items, start=1) if item.type == "run.suspended")
    diff = run_diff(view, "tt", Point("record", 1), Point("record", len(items)))
    changed = {change.field: change for change in diff.changes}
    assert changed["status"].after == "handed_off" or changed["status"].after != "pending"
    assert "journal[0]" in changed and changed["journal[0]"].before is None
    [first_step] = [c for c in changed["journal[0]"].changed_by]
    assert first_step.type == "step.completed"
    status_changes = [cause.record for cause in changed["status"].changed_by]
    assert suspended in status_changes
    same = run_diff(view, "tt", Point("record", 3), Point("record", 3))
    assert same.changes == ()


async def test_cli_history_tree_at_record_and_diff(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with traveller_done(bootstrap, namespace, tmp_path):
        pass
    common: dict[str, Any] = {"bootstrap": bootstrap, "namespace": namespace,
                              "cache": tmp_path / "cache"}
    tree = await cli("run", "history", "tt", "--tree", "--json", **common)
    assert tree.code == 0, tree.err
    shape = json.loads(tree.out)
    assert [r["run_id"] for r in shape["rounds"]] == ["tt", "tt~1"]
    assert [c["run_id"] for c in shape["rounds"][0]["children"]] == ["tt-kid"]
    text = await cli("run", "history", "tt", "--tree", **common)
    assert "child spawned at position" in text.out and "tt~1" in text.out
    # Round 0 by its own name, as `run history tt~0` takes it (it was "no run 'tt~0'").
    zero = await cli("run", "history", "tt~0", "--tree", "--json", **common)
    assert zero.code == 0 and json.loads(zero.out) == shape, zero.err
    began = time.monotonic()  # (a typo waited out the whole timeout, "did not settle")
    typo = await cli("run", "result", "tt-typo", "--timeout", "60", **common)
    assert typo.code != 0 and "no run 'tt-typo'" in typo.err and time.monotonic() - began < 30
    rows = json.loads((await cli("run", "history", "tt", "--json", **common)).out)
    step_row = next(r for r in rows if r["type"] == "step.completed")
    at = await cli("run", "at", "tt", "--record", str(step_row["record"]), "--json", **common)
    assert at.code == 0, at.err
    state = json.loads(at.out)
    assert [e["name"] for e in state["journal"]] == ["first"]
    assert state["at"] == f"record:{step_row['record']}"
    assert state["as_of"] == {"record": step_row["record"], "offset": step_row["offset"],
                              "log_time": iso(step_row["timestamp_ms"]), "records": len(rows),
                              "latest": False}
    # A point past the run's last record shows its state now, and says so (it showed that
    # state as if it were the point's).
    beyond = await cli("run", "at", "tt", "--offset", "99999999", **common)
    assert beyond.code == 0, beyond.err
    assert (f"after record {len(rows)} of {len(rows)} (offset {rows[-1]['offset']}"
            in beyond.out and "the run's last record: its state now" in beyond.out), beyond.out
    first = json.loads((await cli("run", "at", "tt", "--record", "1", "--json", **common)).out)
    assert rows[0]["type"] == "run.create-requested" and first["status"] == "pending"
    # (it said "no worker has claimed partition N; start a worker" of a point in the past)
    assert first["note"] == "not admitted yet at this point", first
    past_end = await cli("run", "at", "tt", "--record", "999", **common)
    assert "past the run's history" in one_line_error(past_end)
    diff = await cli("run", "diff", "tt", "--from", "record:1", "--to",
                     f"record:{len(rows)}", **common)
    assert diff.code == 0, diff.err
    assert "journal[0]" in diff.out and "by record" in diff.out
    bad = await cli("run", "diff", "tt", "--from", "yesterday", "--to", "record:2", **common)
    assert "not a point" in one_line_error(bad)

    same = await cli("run", "fork", "tt", "--dry-run", "--app",
                     "tests.integration.timetravel_flows:flows", "--exit-code", **common)
    assert same.code == 0, same.err
    assert same.out.startswith("no difference"), same.out
    # The lineage's id names its latest round; `tt~0` names round 0, which the change hits.
    changed = await cli("run", "fork", "tt~0", "--dry-run", "--app",
                        "tests.integration.timetravel_flows:renamed_flows", "--exit-code",
                        "--json", **common)
    assert changed.code == 1, changed.err
    report = json.loads(changed.out)
    assert report["difference"]["position"] == 0, report
    assert "first_v2" in json.dumps(report["difference"])


async def test_cli_fork_needs_force_past_a_spawn_and_then_completes(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    common: dict[str, Any] = {"bootstrap": bootstrap, "namespace": namespace,
                              "cache": tmp_path / "cache"}
    async with traveller_done(bootstrap, namespace, tmp_path) as client:
        rows = json.loads((await cli("run", "history", "tt~0", "--json", **common)).out)
        spawn = next(r["record"] for r in rows if r["type"] == "child.spawned")
        refused = await cli("run", "fork", "tt~0", "--at", f"record:{spawn - 1}",
                            "--as", "tt-fork", **common)
        assert "needs --force" in one_line_error(refused)
        assert "child" in refused.err
        forked = await cli("run", "fork", "tt~0", "--at", f"record:{spawn - 1}",
                           "--as", "tt-fork", "--force", "--json", **common)
        assert forked.code == 0, forked.err
        made = json.loads(forked.out)
        assert made["run_id"] == "tt-fork" and made["entries"] == 3  # first, sleep, go
        assert made["forced"] is True
        fork = client.get_handle("tt-fork")
        assert await fork.result(timeout=60, follow=True) == 7
        journal_of_fork = await client.journal("tt-fork")
        assert [e.name for e in journal_of_fork][:3] == ["first", "sleep", "go"]
        status = await cli("run", "status", "tt-fork~0", "--json", **common)
        assert json.loads(status.out)["forked_from"]["run_id"] == "tt"
        text = await cli("run", "status", "tt-fork~0", **common)  # (only --json said it)
        assert "  forked from tt at record " in text.out, text.out
