"""The pending WriteBatch of a store's group of records (projections.store): puts and deletes
by key held until written, blind writes straight into the batch."""

from __future__ import annotations

from rocksdict import WriteBatch

# Key families only ever written blind (projections.writes: history items, the partition's
# own records, the fencing ledger, dead letters): a range of one holds no held write.
BLIND_ONLY = frozenset((b"h/", b"g/", b"f/", b"d/"))


class Pending:
    """A WriteBatch whose puts and deletes by key are held (the last one per key wins) until
    written: a key a group of records writes many times (a run's state, its status, inbox
    and wait indexes) reaches RocksDB once; reads see the held ones. Blind writes go on."""

    __slots__ = ("_batch", "_dirty", "_fresh", "_ops")

    def __init__(self, batch: WriteBatch, ops: dict[bytes, bytes | None]) -> None:
        self._batch = batch
        self._ops = ops  # the store's _pending: key -> value, None: deleted
        # The held writes not in the batch yet, once a range delete wrote the others (None:
        # all are): a range writes these first, not every held write again (an expiry
        # decision's hundreds of ranges in a group of thousands of held writes made its
        # batch millions of operations). Bounded by the held keys.
        self._dirty: dict[bytes, bytes | None] | None = None
        # Held keys absent from the store before this batch put them: a delete of one only
        # drops it (nothing to delete in RocksDB). Bounded by the held keys.
        self._fresh: set[bytes] = set()

    def put(self, key: bytes, value: bytes) -> None:
        self._ops[key] = value
        if self._dirty is not None:
            self._dirty[key] = value

    def fresh(self, key: bytes, value: bytes) -> None:
        """A put of a key the store does not hold (a new run's status and inbox index
        entries, the status a run enters): a new run's pending status and inbox entries
        and its running one, put and deleted in one group, never reach RocksDB."""
        ops = self._ops
        if key not in ops:  # (a held delete: RocksDB may hold it, the delete must stay)
            self._fresh.add(key)
        ops[key] = value
        if self._dirty is not None:
            self._dirty[key] = value

    def blind(self, key: bytes, value: bytes) -> None:
        """A key only scanned, never read back or deleted by key (history, ledgers)."""
        self._batch.put(key, value)

    def delete(self, key: bytes) -> None:
        if key in self._fresh:
            self._fresh.discard(key)
            del self._ops[key]  # (reads find nothing held, and nothing in the store)
            if self._dirty is not None:
                self._dirty.pop(key, None)
        else:
            self._ops[key] = None
            if self._dirty is not None:
                self._dirty[key] = None

    def delete_range(self, begin: bytes, end: bytes) -> None:
        """Keys in [begin, end): only ranges no later read of the batch looks up by key
        (an expired run's entries and history, old bookkeeping); what is held and not
        written yet goes first, and the held keys in the range read as deleted."""
        self.materialize()
        self._batch.delete_range(begin, end)
        if begin[:2] in BLIND_ONLY:
            return  # (no held key there: skip looking through them all)
        for key in [k for k in self._ops if begin <= k < end]:
            self._ops[key] = None  # (the range covers it in the batch: not dirty)

    def materialize(self) -> WriteBatch:
        """The held writes not yet in the batch into it, in the order held (each its key's
        last); none is fresh after: a later delete must reach the batch."""
        self._fresh.clear()
        batch = self._batch
        for key, value in (self._ops if self._dirty is None else self._dirty).items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        self._dirty = {}
        return batch
