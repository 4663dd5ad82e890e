"""Live projections against a rebuild from offset 0, by running hash.

Every applied record chains into its partition's running hash (projections.writes.chain),
so a store whose hash at its next offset equals the rebuild's hash there holds exactly the
rebuild's state for that partition. A session leaves many stores (every slot's data dir and
the driver's read model): instead of one `runstream projection verify` each (a fold of the
whole journal per store), they share ONE fold that notes the running hash at every offset
any of them reached. A store whose hash differs is then verified in full
(engine.ops.verify.verify, key by key), which names the run and fields that differ.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from runstream.engine.config import journal_topic
from runstream.engine.ops.rebuild import FoldSpec, fold_into
from runstream.engine.ops.shards import shard_count, shard_specs
from runstream.engine.ops.verify import NothingToVerify, live_store, verify, worker_store_path
from runstream.projections.fold import FoldResult


@dataclass(frozen=True, slots=True)
class StoreHashes:
    label: str
    data_dir: Path
    hashes: dict[int, tuple[int, str]]  # partition -> (next offset, running hash)


def store_hashes(data_dir: Path) -> StoreHashes | None:
    """A stopped worker's store: each partition's next offset and running hash (None: the
    worker never got a partition)."""
    try:
        path = worker_store_path(data_dir)
        with live_store(path) as store:
            hashes = {p.partition: (p.next_offset, store.running_hash(p.partition))
                      for p in store.partitions() if p.next_offset > 0}
    except NothingToVerify:
        return None
    return StoreHashes(data_dir.name, data_dir, hashes) if hashes else None


async def rebuilt_hashes(bootstrap: str, namespace: str, stores: list[StoreHashes]
                         ) -> dict[tuple[int, int], str]:
    """(partition, offset) -> the rebuild's running hash there, for every offset a store
    reached: one fold from offset 0 up to the furthest of them."""
    wanted: dict[int, list[int]] = {}
    for store in stores:
        for partition, (offset, _) in store.hashes.items():
            wanted.setdefault(partition, []).append(offset)
    until = {p: max(offsets) for p, offsets in wanted.items()}
    scratch = Path(tempfile.mkdtemp(prefix="runstream-chaos-rebuild-"))
    try:
        base = FoldSpec(bootstrap, journal_topic(namespace), scratch, scratch=True,
                        hash_offsets=wanted)
        specs = shard_specs(base, until, shard_count(until))
        found: dict[tuple[int, int], str] = {}
        for result in await _fold_in_processes(specs):
            found.update(result.hashes_at)
        return found
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _fold_one(spec: FoldSpec) -> FoldResult:
    return asyncio.run(fold_into(spec))


async def _fold_in_processes(specs: list[FoldSpec]) -> list[FoldResult]:
    """Each shard folded in its own process, results returned through a process pool.
    Not engine.ops.shards.fold_shards: its parent reads results from a multiprocessing queue
    with a 1 s timeout and calls a shard that exited before its result was read "ended
    without its result", which happens when the result arrives just after a timeout (seen
    here: "fold process runstream-fold-1 ended without its result", exit code 0)."""
    loop = asyncio.get_running_loop()
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(len(specs), mp_context=spawn) as pool:
        return list(await asyncio.gather(
            *(loop.run_in_executor(pool, _fold_one, spec) for spec in specs)))


async def verify_stores(bootstrap: str, namespace: str, worker_dirs: list[Path],
                        read_model_dir: Path) -> tuple[int, list[str]]:
    """(stores verified, one line per store that differs from its rebuild).

    The running hash does not depend on the store's kind (projections.writes), so the read
    model joins the worker stores in the ONE shared fold; any store whose hash differs
    there is then verified key by key, which says what differs."""
    found = [store_hashes(d) for d in [*worker_dirs, read_model_dir]]
    stores = [s for s in found if s is not None]
    problems: list[str] = []
    rebuilt = await rebuilt_hashes(bootstrap, namespace, stores) if stores else {}
    for store in stores:
        differs = [p for p, (offset, live) in store.hashes.items()
                   if not live or rebuilt.get((p, offset)) != live]
        if differs:
            problems.append(await _describe(bootstrap, namespace, store, differs,
                                            read_model_dir))
    if found[-1] is None:
        problems.append(f"read model in {read_model_dir}: holds no partition")
    return len(stores), problems


async def _describe(bootstrap: str, namespace: str, store: StoreHashes, differs: list[int],
                    read_model_dir: Path) -> str:
    """The full verify of a store whose running hash differs: what differs, key by key."""
    is_model = store.data_dir == read_model_dir
    report = await verify(bootstrap=bootstrap, namespace=namespace,
                          data_dir=None if is_model else store.data_dir,
                          read_model_dir=read_model_dir if is_model else None)
    detail = "key by key equal"
    if report.divergence is not None:
        detail = (f"{report.divergence.describe()}; "
                  f"{[d.as_dict() for d in report.divergence.differences[:3]]}")
    label = "read model" if is_model else f"worker store {store.label}"
    return f"{label}: running hash of partitions {differs} differs from the rebuild's; {detail}"
