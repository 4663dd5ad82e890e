"""A RocksDB secondary instance (a read-only follower of another process's primary) that
stays true to its primary.

A secondary keeps in its memtable what it replayed from the primary's write-ahead log. Once
the primary flushes those writes to a table file (a memtable that filled up, or its close)
and retires the log, a catch-up adds the file but keeps the replayed entries, and they
shadow the newer values the file holds for the same keys (facebook/rocksdb#15051; rocksdict
0.3.29, the newest, has it). A read model then answered from a mix of old and new state: a
partition's `next_offset` from before the flush over history written after it, so that
`run history` took records of other runs for an expired run's own. A catch-up that finds a
table file it did not have therefore opens the instance again, which reads the files and
replays only the logs not yet flushed."""

from __future__ import annotations

from pathlib import Path

from rocksdict import AccessType, Options, Rdict


class SecondaryDb:
    """The secondary instance of the store at `path`, its own files under `secondary_path`
    (one directory per opening). `db` is the instance to read; catch_up() may replace it
    (the one before closes once no reader holds it)."""

    def __init__(self, path: Path, secondary_path: Path) -> None:
        self._path = path
        self._secondary_path = Path(secondary_path)
        self.opened = 0  # how many times opened: 1 until a flush of the primary
        self.db = self._open()
        self._files = self._table_files()

    def catch_up(self) -> None:
        """Follow the primary: replay its new log entries, or, when it wrote a table file
        since (a flush: a compaction's output too, which is rarer), open again."""
        self.db.try_catch_up_with_primary()
        files = self._table_files()
        if files <= self._files:
            self._files = files
            return
        self.db = self._open()
        self._files = self._table_files()

    def _open(self) -> Rdict:
        self.opened += 1
        where = self._secondary_path / f"instance-{self.opened}"
        where.mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.set_max_open_files(-1)
        return Rdict(str(self._path), options, access_type=AccessType.secondary(str(where)))

    def _table_files(self) -> frozenset[str]:
        return frozenset(str(entry["name"]) for entry in self.db.live_files())
