"""A RocksDB secondary instance (a read-only follower of another process's primary) that
stays true to its primary.

A secondary keeps in its memtable what it replayed from the primary's write-ahead logs.
Once the primary flushes those writes to a table file (a memtable that filled up, or its
close) and retires the log, a catch-up adds the file but keeps the replayed entries, and they
shadow the newer values the file holds for the same keys (facebook/rocksdb#15051; rocksdict
0.3.29, the newest, has it). A read model then answered from a mix of old and new state: a
partition's `next_offset` from before the flush over history written after it, so that
`run history` took records of other runs for an expired run's own.

A catch-up therefore opens the instance again when the primary flushed since the last one:
a level-0 table file it did not have (a flush's output), or a log it may have replayed gone
(a flush retires it; a compaction that moved the flushed file on leaves no new level-0
file). The new instance reads the files and replays only the logs not yet flushed.
Compactions alone (new files on other levels) open nothing again: an opening costs about a
millisecond a table file. A reopened instance may read a state older than the stale one it
replaces (from before the flush's last writes, which it replays at its next catch-up): a
reader folds on from whatever `next_offset` it reads."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from rocksdict import AccessType, Options, Rdict

log = logging.getLogger("runstream.store")


class SecondaryDb:
    """The secondary instance of the store at `path`, its own files under `secondary_path`
    (one directory per opening, the one before removed). `db` is the instance to read;
    catch_up() may replace it (the one before closes once no reader holds it)."""

    def __init__(self, path: Path, secondary_path: Path) -> None:
        self._path = path
        self._secondary_path = Path(secondary_path)
        self.opened = 0  # how many times opened: 1 until a flush of the primary
        self.db = self._open()
        self._flushed, self._logs = self._level_zero(), self._live_logs()

    def catch_up(self) -> None:
        """Follow the primary: replay its new log entries, or open again when it flushed."""
        self.db.try_catch_up_with_primary()
        flushed, logs = self._level_zero(), self._live_logs()
        if not flushed - self._flushed and self._logs <= logs:
            self._flushed, self._logs = flushed, logs
            return
        try:
            self.db = self._open()
        except Exception as exc:  # rocksdict raises a bare Exception; the next catch-up tries
            log.warning("the read model's secondary in %s could not open again after its "
                        "primary flushed (%s): reading the instance before", self._path, exc)
            return
        shutil.rmtree(self._secondary_path / f"instance-{self.opened - 1}",
                      ignore_errors=True)
        self._flushed, self._logs = self._level_zero(), self._live_logs()

    def _open(self) -> Rdict:
        where = self._secondary_path / f"instance-{self.opened + 1}"
        where.mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.set_max_open_files(-1)
        try:
            db = Rdict(str(self._path), options, access_type=AccessType.secondary(str(where)))
        except Exception:
            shutil.rmtree(where, ignore_errors=True)
            raise
        self.opened += 1
        return db

    def _level_zero(self) -> frozenset[str]:
        return frozenset(str(entry["name"]) for entry in self.db.live_files()
                         if entry["level"] == 0)

    def _live_logs(self) -> frozenset[str]:
        """The primary's write-ahead logs now (recorded after a catch-up: among them, every
        log the instance replayed and not yet retired)."""
        try:
            return frozenset(name for name in os.listdir(self._path) if name.endswith(".log"))
        except OSError:
            return frozenset()
