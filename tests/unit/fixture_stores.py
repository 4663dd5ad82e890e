"""A committed fixture journal folded into a read model's RocksDB store (records kept), as
the UI and the time-travel queries read one, without a broker."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from runstream.engine.journal import encode
from runstream.engine.readmodel.view import View
from runstream.projections.projector import Projector
from runstream.projections.store import ProjectionStore
from tests.unit.test_replay_fixtures import load

T = TypeVar("T")


def fixture_store(journal: Path, path: Path) -> tuple[ProjectionStore, int]:
    """The store at `path` with `journal` applied, and the journal's partition count; the
    caller closes it."""
    records = load(journal)
    partitions = max(p for p, *_ in records) + 1
    store = ProjectionStore(path, partitions=partitions, keep_records=True)
    projector = Projector(store)
    for partition, offset, record, timestamp in records:
        value, headers = encode(record)
        projector.apply_raw(partition, offset, value, headers, timestamp)
    store.flush()
    return store, partitions


class StoreModel:
    """What the UI asks of its read model, answered from one store already folded (no
    catch-up: the store holds all there is)."""

    def __init__(self, store: ProjectionStore, partitions: int) -> None:
        self.store, self.partitions = store, partitions

    async def catch_up(self, partitions: list[int] | None = None) -> View:
        return View(self.store, None, self.partitions)

    async def complete(self, view: View, *args: Any, **kwargs: Any) -> View:
        return view

    async def close(self) -> None:
        pass

    async def in_thread(self, work: Callable[[], T]) -> T:
        return work()
