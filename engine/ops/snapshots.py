"""Each journal partition's newest snapshot as an operator's command judges it: anchored in
the journal (the read model folds the anchors: PartitionState.snapshot_*), complete and
intact in `<ns>.snapshots` (its manifest there, every chunk it names present and matching
its digests). What `runstream topics alter --journal-retention` checks before it lets the
broker delete records (projections.snapshot_horizon)."""

from __future__ import annotations

import asyncio

from runstream.engine.config import journal_topic, snapshot_topic
from runstream.engine.kafka.connection import KafkaSecurity
from runstream.engine.kafka.snapshots import list_manifests, read_chunks
from runstream.engine.readmodel.model import ReadModel
from runstream.projections.snapshot import Manifest, SnapshotInvalid, assemble
from runstream.projections.snapshot_horizon import SnapshotStanding


async def snapshot_standings(bootstrap: str, namespace: str, *,
                             security: KafkaSecurity | None = None
                             ) -> dict[int, SnapshotStanding]:
    """Every journal partition's standing (see the module)."""
    async with ReadModel(bootstrap=bootstrap, topic=journal_topic(namespace),
                         security=security) as model:
        view = await model.catch_up()
        states = {p: view.partition(p) for p in range(model.partitions)}
    standings = {}
    for partition, state in states.items():
        if state.snapshot_id is None:
            standings[partition] = SnapshotStanding(partition, None, None, None, False)
            continue
        listed = await list_manifests(bootstrap, snapshot_topic(namespace), partition,
                                      security=security)
        manifest = next((item.manifest for item in listed
                         if item.snapshot_id == state.snapshot_id and item.manifest), None)
        complete = manifest is not None and await intact(bootstrap, namespace, manifest,
                                                         security=security)
        standings[partition] = SnapshotStanding(partition, state.snapshot_id,
                                                state.snapshot_ms, state.snapshot_offset,
                                                complete)
    return standings


async def intact(bootstrap: str, namespace: str, manifest: Manifest, *,
                 security: KafkaSecurity | None = None) -> bool:
    """Every chunk the manifest names is there and the whole checks (a thread decodes)."""
    chunks = await read_chunks(bootstrap, snapshot_topic(namespace), manifest,
                               security=security)
    try:
        await asyncio.to_thread(lambda: sum(1 for _ in assemble(manifest, chunks)))
    except SnapshotInvalid:
        return False
    return True
