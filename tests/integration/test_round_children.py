"""Children spawned by a lineage's later round live in their own partition, on a real broker.

A child's records are keyed by its own lineage: the child's id (`<parent round>-kid`, or the
default `<lin>~1@<incarnation>.<position>`). Its keys in the store, its snapshot, its
requests and the client's routing must all follow that partition, not the root lineage's
(`lin`), which the text before the first `~` names. The test places the root lineage on one
worker and the children on the other, signals the children through every door (a client
with a Flow object, one by flow name, the CLI, a signal a plain producer writes from
schemas/ alone), and has the children's worker stop half way, so that the other takes their
partitions over from its snapshots."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from runstream import Client, RunNotFound, RunStatus, Worker
from runstream.projections.partitioning import partition_for, run_partition
from tests.conftest import TEST_JOURNAL_PARTITIONS
from tests.integration.round_children_flows import KIDS as DOORS
from tests.integration.round_children_flows import (
    flows,
    hopper_parent,
    named_children,
    rounds,
    split_lineage,
)
from tests.integration.support import fold, status_when, until
from tests.integration.test_cli import cli
from tests.integration.test_lifetime import doors, plain_request, produce_plain

FLOWS = flows


@asynccontextmanager
async def worker(bootstrap: str, namespace: str, path: Path) -> AsyncIterator[Worker]:
    # (a partition more than `snapshot_every` records behind is taken over from a snapshot)
    w = Worker(flows=FLOWS, data_dir=path, bootstrap_servers=bootstrap, namespace=namespace,
               session_timeout_ms=6000, snapshot_every=1)
    await w.start()
    try:
        yield w
    finally:
        await w.stop()


async def signal(door: str, child: str, value: int, *, knows: Client, nameless: Client,
                 bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    if door == "flow":
        await knows.signal(child, "go", value)
    elif door == "name":
        await nameless.signal(child, "go", value)
    elif door == "cli":
        done = await cli("run", "signal", child, "go", "--payload", json.dumps(value),
                         bootstrap=bootstrap, namespace=namespace, cache=tmp_path / "cache")
        assert done.code == 0, done.err
    else:  # keyed by the child's own id, the key a plain producer gives it (its lineage)
        value_bytes = plain_request("run.signal-sent", child, name="go",
                                    payload_json=json.dumps(value))
        await produce_plain(bootstrap, journal, child, value_bytes,
                            record_type="run.signal-sent")


async def test_children_of_a_later_round_live_and_move_with_their_own_partition(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with worker(bootstrap, namespace, tmp_path / "a") as a, \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS) as knows, \
            Client(bootstrap_servers=bootstrap, namespace=namespace) as nameless:
        async with worker(bootstrap, namespace, tmp_path / "b") as b:
            await until(lambda: a.owned and b.owned and len({*a.owned, *b.owned})
                        == TEST_JOURNAL_PARTITIONS, "both workers owning partitions")
            lineage = split_lineage(set(a.owned), set(b.owned), TEST_JOURNAL_PARTITIONS)
            await knows.create_run(rounds, {"round": 0}, run_id=lineage)
            children = named_children(lineage)
            for child in children:
                await status_when(knows, child, RunStatus.suspended)
            derived = await until(lambda: _default_child(knows, f"{lineage}~1"),
                                  "the child of a default id")
            await status_when(knows, derived, RunStatus.suspended)
            await knows.signal(derived, "go", 100)
            await signal("flow", children[0], 1, knows=knows, nameless=nameless,
                         bootstrap=bootstrap, namespace=namespace, journal=journal,
                         tmp_path=tmp_path)
            await status_when(knows, children[0], RunStatus.completed)
        # b stopped: a took its partitions over from their snapshots, the children's with them
        await until(lambda: len(a.owned) == TEST_JOURNAL_PARTITIONS, "a owning every partition")
        moved = {run_partition(child, TEST_JOURNAL_PARTITIONS) for child in children}
        await until(lambda: moved <= set(a.takeovers.reports), "a's takeovers")
        assert {a.takeovers.reports[p].source for p in moved} == {"snapshot"}
        for value, (door, child) in enumerate(zip(DOORS[1:], children[1:], strict=True), 2):
            await signal(door, child, value, knows=knows, nameless=nameless,
                         bootstrap=bootstrap, namespace=namespace, journal=journal,
                         tmp_path=tmp_path)
        result = await knows.get_handle(lineage).result(timeout=60, follow=True)
        assert result == 1 + 2 + 3 + 4 + 100
    tree = await cli("run", "history", lineage, "--tree", "--json", bootstrap=bootstrap,
                     namespace=namespace, cache=tmp_path / "cache")
    assert tree.code == 0, tree.err
    rounds_shown = json.loads(tree.out)["rounds"]
    assert [r["run_id"] for r in rounds_shown] == [lineage, f"{lineage}~1"]
    assert sorted(c["run_id"] for c in rounds_shown[1]["children"]) == sorted(
        [*children, derived])
    assert all(c["records"] for c in rounds_shown[1]["children"]), tree.out  # found, read
    view = await fold(bootstrap, namespace)
    for child in [*children, derived]:
        assert view.runs[child] is not None and view.runs[child].status is RunStatus.completed
        placed = {item.partition for item in view.history[child]}
        assert placed == {run_partition(child, TEST_JOURNAL_PARTITIONS)}, (child, placed)
        assert placed != {partition_for(lineage, TEST_JOURNAL_PARTITIONS)} or child == derived


async def _default_child(client: Client, parent: str) -> str | None:
    try:
        run = await client.describe(parent)
    except RunNotFound:  # the round is not there yet
        return None
    named = {f"{parent}-kid-{door}" for door in DOORS}
    kids = [link.run_id for link in run.children if link.run_id not in named]
    return kids[0] if kids else None


@pytest.mark.parametrize("door", DOORS)
async def test_a_later_round_s_child_that_hands_off_wakes_its_parent_through_every_door(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path, door: str
) -> None:
    """The child's last round (`hp~1@<inc>.0~2`) wakes round 1: its wake is matched by the
    child's lineage, its own id (before, the root's, and round 1 waited for ever)."""
    run_id = f"hp-{door}"
    async with worker(bootstrap, namespace, tmp_path / "w"), \
            doors(bootstrap, namespace, journal, tmp_path) as (client, create):
        await create(door)(hopper_parent, 0, run_id)
        result = await client.get_handle(run_id).result(timeout=60, follow=True)
    assert result.startswith(f"hopped to {run_id}~1@") and result.endswith("~2")
    child = result.removeprefix("hopped to ").removesuffix("~2")
    view = await fold(bootstrap, namespace)
    assert {item.partition for item in view.history[f"{child}~2"]} == {
        run_partition(child, TEST_JOURNAL_PARTITIONS)}
