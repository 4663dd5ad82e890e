"""The pending WriteBatch of a store's group of records (projections.store): puts and deletes
by key held until written, blind writes straight into the batch."""

from __future__ import annotations

from rocksdict import WriteBatch


class Pending:
    """A WriteBatch whose puts and deletes by key are held (the last one per key wins) until
    written: a key a group of records writes many times (a run's state, its status, inbox
    and wait indexes) reaches RocksDB once; reads see the held ones. Blind writes go on."""

    __slots__ = ("_batch", "_ops")

    def __init__(self, batch: WriteBatch, ops: dict[bytes, bytes | None]) -> None:
        self._batch = batch
        self._ops = ops  # the store's _pending: key -> value, None: deleted

    def put(self, key: bytes, value: bytes) -> None:
        self._ops[key] = value

    def blind(self, key: bytes, value: bytes) -> None:
        """A key only scanned, never read back or deleted by key (history, ledgers)."""
        self._batch.put(key, value)

    def delete(self, key: bytes) -> None:
        self._ops[key] = None

    def delete_range(self, begin: bytes, end: bytes) -> None:
        """Keys in [begin, end): only ranges no later read of the batch looks up by key
        (an expired run's entries and history, old bookkeeping); what is held goes first."""
        self.materialize()
        self._batch.delete_range(begin, end)
        for key in [k for k in self._ops if begin <= k < end]:
            self._ops[key] = None

    def materialize(self) -> WriteBatch:
        """The held writes into the batch (again after a range: each is its key's last)."""
        for key, value in self._ops.items():
            if value is None:
                self._batch.delete(key)
            else:
                self._batch.put(key, value)
        return self._batch
