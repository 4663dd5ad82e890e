"""The pending WriteBatch of a store's group of records (projections.store): puts and deletes
by key held until written, blind writes straight into the batch."""

from __future__ import annotations

from rocksdict import WriteBatch


class Pending:
    """A WriteBatch whose puts and deletes by key are held (the last one per key wins) until
    written: a key a group of records writes many times (a run's state, its status, inbox
    and wait indexes) reaches RocksDB once; reads see the held ones. Blind writes go on."""

    __slots__ = ("_batch", "_fresh", "_ops")

    def __init__(self, batch: WriteBatch, ops: dict[bytes, bytes | None]) -> None:
        self._batch = batch
        self._ops = ops  # the store's _pending: key -> value, None: deleted
        # Held keys absent from the store before this batch put them: a delete of one only
        # drops it (nothing to delete in RocksDB). Bounded by the held keys.
        self._fresh: set[bytes] = set()

    def put(self, key: bytes, value: bytes) -> None:
        self._ops[key] = value

    def fresh(self, key: bytes, value: bytes) -> None:
        """A put of a key the store does not hold (a new run's status and inbox index
        entries, the status a run enters): a new run's pending status and inbox entries
        and its running one, put and deleted in one group, never reach RocksDB."""
        ops = self._ops
        if key not in ops:  # (a held delete: RocksDB may hold it, the delete must stay)
            self._fresh.add(key)
        ops[key] = value

    def blind(self, key: bytes, value: bytes) -> None:
        """A key only scanned, never read back or deleted by key (history, ledgers)."""
        self._batch.put(key, value)

    def delete(self, key: bytes) -> None:
        if key in self._fresh:
            self._fresh.discard(key)
            del self._ops[key]  # (reads find nothing held, and nothing in the store)
        else:
            self._ops[key] = None

    def delete_range(self, begin: bytes, end: bytes) -> None:
        """Keys in [begin, end): only ranges no later read of the batch looks up by key
        (an expired run's entries and history, old bookkeeping); what is held goes first."""
        self.materialize()
        self._batch.delete_range(begin, end)
        for key in [k for k in self._ops if begin <= k < end]:
            self._ops[key] = None

    def materialize(self) -> WriteBatch:
        """The held writes into the batch (again after a range: each is its key's last);
        none is fresh after: a later delete must reach the batch."""
        self._fresh.clear()
        for key, value in self._ops.items():
            if value is None:
                self._batch.delete(key)
            else:
                self._batch.put(key, value)
        return self._batch
