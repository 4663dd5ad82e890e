"""A child a later round spawns is a lineage of its own: it is placed (store keys, snapshot,
routing) by the partition its records are keyed to, not by its root lineage's. Store format
3 placed it by the root lineage; opening such a store moves its keys (projections.
store_migrate), and a snapshot of that time no longer loads them into the wrong partition.
The journal is the `round-children` fixture, recorded from a real broker."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from rocksdict import Options, Rdict

from runstream import Flow, FlowContext, Handoff, RunFailed, RunStatus
from runstream.engine.journal.records import is_round, lineage_of
from runstream.engine.testing import TestEnvironment
from runstream.projections import keys
from runstream.projections.partitioning import partition_for, run_partition
from runstream.projections.projector import Projector
from runstream.projections.snapshot import FORMAT, Manifest, partition_items, placed_pairs
from runstream.projections.store import ProjectionStore
from runstream.projections.store_migrate import migrate_placement
from tests.integration.round_children_flows import flows, hopper, hopper_parent, rounds
from tests.unit.test_replay_fixtures import JOURNALS, load

PARTITIONS = 4
FIXTURE = JOURNALS / "round-children.jsonl"


@pytest.mark.parametrize(("run_id", "lineage"), [
    ("lin", "lin"), ("lin~1", "lin"), ("lin~12", "lin"), ("lin~0", "lin"),
    ("lin~1@4.0", "lin~1@4.0"), ("lin~1-kid", "lin~1-kid"), ("lin~1@4.0~2", "lin~1@4.0"),
    ("lin@3.0~1", "lin@3.0"), ("lin~1@4.0~2@9.1", "lin~1@4.0~2@9.1"), ("lin~", "lin~"),
    ("lin~1x", "lin~1x"),
    ("lin~\u0661", "lin~\u0661"),  # (an Arabic-Indic digit is no round number)
])
def test_only_a_trailing_round_number_names_a_round(run_id: str, lineage: str) -> None:
    assert lineage_of(run_id) == lineage
    assert is_round(run_id) is (run_id != lineage)


def _children() -> list[str]:
    named = {r.envelope.run_id for _, _, r, _ in load(FIXTURE)}
    return sorted(run_id for run_id in named if "~1" in run_id and not is_round(run_id))


def _fold(path: Path) -> ProjectionStore:
    store = ProjectionStore(path, partitions=PARTITIONS)
    projector = Projector(store)
    for partition, offset, record, timestamp_ms in load(FIXTURE):
        projector.apply_record(partition, offset, record, timestamp_ms)
    store.flush()
    return store


def test_a_later_round_s_children_are_kept_in_their_own_partition(tmp_path: Path) -> None:
    children = _children()
    assert len(children) == 5  # four of chosen ids, one of the default id
    for child in children:  # (the fixture's lineage places no child with its root)
        assert run_partition(child, PARTITIONS) != partition_for(child.split("~", 1)[0],
                                                                 PARTITIONS)
    records = load(FIXTURE)
    store = _fold(tmp_path / "p")
    try:  # every record is on its home partition: none is set aside as misplaced
        assert sum(store.partition(p).dead_letters for p in range(PARTITIONS)) == 0
        for child in children:
            own = run_partition(child, PARTITIONS)
            assert {p for p, _, r, _ in records if r.envelope.run_id == child} == {own}
            run = store.run(child)
            assert run is not None and run.status is RunStatus.completed
            assert run.partition == own and store.entries(child)
            # what a snapshot of its partition holds, and what a takeover of it clears
            held = dict(partition_items(store.items(), own))
            assert keys.run_key(own, child) in held
            assert any(k.startswith(keys.history_prefix(own, child)) for k in held)
    finally:
        store.close()


def _as_format_3(current: list[tuple[bytes, bytes]], path: Path) -> int:
    """A store holding `current` (a format 4 store's pairs) as format 3 wrote it: each
    run-keyed key under the partition of the text before its name's first `~`."""
    db = Rdict(str(path), Options(raw_mode=True))
    moved = 0
    for key, value in current:
        if key[:2] in keys.RUN_KEYED_PREFIXES:
            name = keys.keyed_name(key)
            old = b"%05d" % partition_for(name.split("~", 1)[0], PARTITIONS)
            moved += old != key[2:7]
            key = key[:2] + old + key[7:]
        db[key] = value
    db[keys.FORMAT_KEY] = b"3"
    db.close()
    return moved


def test_a_format_3_store_is_moved_in_place_once(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    store = _fold(tmp_path / "new")
    current = list(store.items())
    store.close()
    moved = _as_format_3(current, tmp_path / "old")
    assert moved > 10  # each child's run, journal entries, history items, lineage
    with caplog.at_level(logging.WARNING, logger="runstream.projections.store_migrate"):
        upgraded = ProjectionStore(tmp_path / "old")
    try:
        assert list(upgraded.items()) == current  # nothing lost, nothing left behind
        assert f"moved {moved} keys" in caplog.text
        for child in _children():
            assert upgraded.run(child) is not None
    finally:
        upgraded.close()
    db = Rdict(str(tmp_path / "old"), Options(raw_mode=True))
    try:
        assert db[keys.FORMAT_KEY] == keys.STORE_FORMAT
        assert migrate_placement(db) == 0  # a move cut short is simply done again
    finally:
        db.close()


def test_a_snapshot_of_the_old_layout_no_longer_loads_a_child_into_the_wrong_partition(
    tmp_path: Path,
) -> None:
    store = _fold(tmp_path / "new")
    try:
        current = list(store.items())
    finally:
        store.close()
    _as_format_3(current, tmp_path / "old")
    db = Rdict(str(tmp_path / "old"), Options(raw_mode=True))
    try:  # the root's partition as a format 2 snapshot of it held it
        root = partition_for("lin-3", PARTITIONS)
        old_pairs = [(bytes(k), bytes(v)) for k, v in db.items()
                     if k[:2] in keys.RUN_KEYED_PREFIXES and int(k[2:7]) == root]
    finally:
        db.close()
    manifest = Manifest(snapshot_id="s", partition=root, offset=0, epoch=1, key_count=0,
                        chunks=(), content_digest="", running_hash="", created_ms=0,
                        writer="w", format=2)
    kept, dropped = placed_pairs(old_pairs, manifest, PARTITIONS)
    names = {keys.keyed_name(k) for k, _ in kept}
    assert names == {"lin-3", "lin-3~1"} and dropped == len(old_pairs) - len(kept) > 0
    now = Manifest(**{**{f: getattr(manifest, f) for f in Manifest.__slots__}, "format": FORMAT})
    assert placed_pairs(old_pairs, now, PARTITIONS) == (old_pairs, 0)


@pytest.mark.parametrize("by_name", [False, True], ids=["flow", "name"])
async def test_the_test_environment_places_and_signals_a_later_round_s_children(
        by_name: bool) -> None:
    async with TestEnvironment(flows, partitions=PARTITIONS) as env:
        lineage = "lin-3"  # its children are in other partitions than its own
        await env.start(rounds.name if by_name else rounds, {"round": 0}, run_id=lineage)
        await env.run_until_idle()
        kids = [k.run_id for k in env.describe(f"{lineage}~1").children]
        assert len(kids) == 5 and {run_partition(k, PARTITIONS) for k in kids} != {
            partition_for(lineage, PARTITIONS)}
        assert {env.partition_of(k) for k in kids} == {run_partition(k, PARTITIONS)
                                                       for k in kids}
        assert {env.status(k) for k in kids} == {RunStatus.suspended}
        for value, kid in enumerate(kids, 1):
            await env.signal(kid, "go", value)
        assert await env.result(lineage, follow=True) == 15


spawner: Flow[Any, Any] = Flow("round-named-spawner")
kid: Flow[Any, Any] = Flow("round-named-kid")


@spawner.handler
async def _spawner(ctx: FlowContext, payload: Any) -> Any:
    if payload == 0:
        return Handoff(payload=1)
    await ctx.spawn(kid, None, run_id="other~2")  # names round 2 of `other`, not a child
    return "spawned"


@kid.handler
async def _kid(ctx: FlowContext, payload: Any) -> str:
    return "kid"


async def test_a_child_id_that_names_a_round_is_refused() -> None:
    async with TestEnvironment([spawner, kid]) as env:
        await env.start(spawner, 0, run_id="s")
        with pytest.raises(RunFailed, match="SpawnRefused") as failed:
            await env.result("s", follow=True)
        assert "names round n of a lineage" in str(failed.value)



@pytest.mark.parametrize("by_name", [False, True], ids=["flow", "name"])
async def test_a_later_round_s_child_that_hands_off_wakes_its_parent(by_name: bool) -> None:
    """Its wake comes from its last round (`<child>~2`), matched by its lineage: the child's
    own id, which reading up to the first `~` made the parent's root lineage instead."""
    async with TestEnvironment([hopper, hopper_parent], partitions=PARTITIONS) as env:
        await env.start(hopper_parent.name if by_name else hopper_parent, 0, run_id="hp")
        result = await env.result("hp", follow=True)
        assert env.describe("hp~1").children == ()  # (a settled child is no longer open)
        assert result.startswith("hopped to hp~1@") and result.endswith("~2")


async def test_a_child_cancelled_by_a_later_rounds_exit_is_woken_by_its_parent() -> None:
    """Round 0 spawns it, round 1's exit cancels it: its wake says "parent" (it said
    "operator": the canceller is not the round that spawned it, but it is its lineage)."""
    from runstream import Flow, Handoff
    from runstream.testing import TestEnvironment

    kid, par = Flow("r-kid"), Flow("r-par")

    @kid.handler
    async def _kid(ctx: FlowContext, payload: Any) -> Any:
        return await ctx.wait_for("go")

    @par.handler
    async def _par(ctx: FlowContext, payload: Any) -> Any:
        if payload == 0:
            await ctx.spawn(kid, payload)
            return Handoff(payload=1)
        return "done"

    async with TestEnvironment([kid, par]) as env:
        await env.start(par, 0, run_id="P")
        assert await env.result("P", follow=True) == "done"
        await env.run_until_idle()
        child = env.describe("P@1.0")
        reasons = [h.record.reason for h in env.history("P@1.0")
                   if h.record is not None and h.record.TYPE == "run.resumed"]
        assert (child.status.value, child.cancel_requested_by, reasons) == (
            "cancelled", "P~1", ["parent"])
