"""The RocksDB key layout of a projection (see projections.store for what each holds).

ASCII prefixes and zero-padded numbers, so byte order is numeric order and every index is
a prefix scan.
"""

from __future__ import annotations

from runstream.projections.state import RunStatus, Wait


def partition_key(partition: int) -> bytes:
    return b"p/%05d" % partition


# The run-keyed families (r/ j/ h/ l/ b/ c/) put the partition that holds the name (its
# lineage's: projections.partitioning.run_partition) right after their prefix, as every
# other family does, so that a partition's keys are a handful of key ranges: a snapshot
# reads, and a takeover clears, the partition's keys and no others.
RUN_KEYED_PREFIXES = (b"b/", b"c/", b"h/", b"j/", b"l/", b"r/")


def keyed_name(key: bytes) -> str:
    """The run, lineage or schedule id of a run-keyed key (`r/<P:05d>/<name>[\0...]`)."""
    return key[8:].split(b"\x00", 1)[0].decode()


def run_key(partition: int, run_id: str) -> bytes:
    return b"r/%05d/%s" % (partition, run_id.encode())


def runs_prefix(partition: int) -> bytes:
    return b"r/%05d/" % partition


def entries_prefix(partition: int, run_id: str) -> bytes:
    # NUL ends the run id, so run "a" never scans the entries of run "a/b".
    return b"j/%05d/%s\x00" % (partition, run_id.encode())


def entry_key(partition: int, run_id: str, position: int) -> bytes:
    return b"j/%05d/%s\x00%010d" % (partition, run_id.encode(), position)


def status_prefix(status: RunStatus) -> bytes:
    return _STATUS_PREFIXES[status]


def status_key(status: RunStatus, partition: int, run_id: str) -> bytes:
    return _STATUS_PREFIXES[status] + b"%05d/%s" % (partition, run_id.encode())


# Built once: Enum.value is a property, and status keys are made for most records.
_STATUS_PREFIXES = {status: b"s/%s/" % status.value.encode() for status in RunStatus}


def inbox_key(partition: int, run_id: str) -> bytes:
    return b"i/%05d/%s" % (partition, run_id.encode())


def history_prefix(partition: int, run_id: str) -> bytes:
    return b"h/%05d/%s\x00" % (partition, run_id.encode())


def history_key(placed: int, run_id: str, partition: int, offset: int) -> bytes:
    """The history item of the record at `partition`/`offset` of the run (placed in
    partition `placed`, its lineage's: the record's own partition unless misplaced)."""
    # history_prefix(placed, run_id) + b"%05d/%020d", in one format (one per record)
    return b"h/%05d/%s\x00%05d/%020d" % (placed, run_id.encode(), partition, offset)


def partition_history_key(partition: int, offset: int) -> bytes:
    return b"g/%05d/%020d" % (partition, offset)


def request_key(partition: int, request_id: str) -> bytes:
    # Per partition: a request id is only ever re-sent to its own partition, and the
    # synthetic ids of id-less requests ("offset-N") repeat across partitions.
    return b"q/%05d/%s" % (partition, request_id.encode())


def request_offset_key(partition: int, offset: int) -> bytes:
    return b"o/%05d/%020d" % (partition, offset)


def dead_letter_key(partition: int, offset: int) -> bytes:
    return b"d/%05d/%020d" % (partition, offset)


def timer_prefix(partition: int) -> bytes:
    return b"t/%05d/" % partition


def timer_key(partition: int, run_id: str, wait: Wait) -> bytes:
    return timer_prefix(partition) + b"%015d/%s\x00%010d" % (
        wait.due_ms or 0, run_id.encode(), wait.position or 0)


DEADLINE_POSITION = 9_999_999_999  # a run deadline's timer entry (a step position never is)


def deadline_key(partition: int, run_id: str, due_ms: int) -> bytes:
    """A run's deadline (projections.deadlines) in the timer index, beside its wait's timer."""
    return timer_prefix(partition) + b"%015d/%s\x00%010d" % (
        due_ms, run_id.encode(), DEADLINE_POSITION)


def schedule_key(partition: int, schedule_id: str) -> bytes:
    """A schedule's state (projections.schedule_state), placed by its id like a run."""
    return b"c/%05d/%s" % (partition, schedule_id.encode())


def schedule_index_prefix(partition: int) -> bytes:
    return b"a/%05d/" % partition


def schedule_index_key(partition: int, schedule_id: str) -> bytes:
    """Every schedule a partition holds (created, or asked to be): `list`, the claim sweep."""
    return schedule_index_prefix(partition) + schedule_id.encode()


def fire_prefix(partition: int) -> bytes:
    return b"n/%05d/" % partition


def fire_key(partition: int, due_ms: int, schedule_id: str) -> bytes:
    """A schedule by when its owner acts on it next (its next fire, unless paused)."""
    return fire_prefix(partition) + b"%015d/%s" % (due_ms, schedule_id.encode())


def idle_schedule_prefix(partition: int) -> bytes:
    return b"u/%05d/" % partition


def idle_schedule_key(partition: int, since_ms: int, schedule_id: str) -> bytes:
    """A schedule by since when it is a leftover (ScheduleState.idle_since_ms): what the
    retention sweep drops once that is older than the retention."""
    return idle_schedule_prefix(partition) + b"%015d/%s" % (since_ms, schedule_id.encode())


def wait_key(partition: int, kind: str, run_id: str) -> bytes:
    return b"w/%05d/%s/%s" % (partition, kind.encode(), run_id.encode())


def outbox_prefix(partition: int) -> bytes:
    return b"x/%05d/" % partition


def upper_bound(prefix: bytes) -> bytes:
    return prefix[:-1] + bytes([prefix[-1] + 1])


def lineage_key(partition: int, lineage_id: str) -> bytes:
    """The lineage's latest round (its run id): what a request naming the lineage reaches."""
    return b"l/%05d/%s" % (partition, lineage_id.encode())


def hash_key(partition: int) -> bytes:
    """The partition's running hash (projections.writes.chain) after its next_offset - 1."""
    return b"v/%05d" % partition


def fenced_prefix(partition: int) -> bytes:
    return b"f/%05d/" % partition


def fenced_key(partition: int, offset: int) -> bytes:
    """A record written but not applied (fenced, rejected, duplicate) -> its run id."""
    return fenced_prefix(partition) + b"%020d" % offset


def settled_prefix(partition: int) -> bytes:
    return b"e/%05d/" % partition


def settled_key(partition: int, settled_ms: int, run_id: str) -> bytes:
    """A lineage's final round, settled at log time `settled_ms`: what retention sweeps."""
    return settled_prefix(partition) + b"%015d/%s" % (settled_ms, run_id.encode())


def tombstone_key(partition: int, run_id: str) -> bytes:
    return b"b/%05d/%s" % (partition, run_id.encode())


def tombstone_prefix(partition: int) -> bytes:
    return b"k/%05d/" % partition


def tombstone_index_key(partition: int, expired_ms: int, run_id: str) -> bytes:
    """A tombstone by its expiry's log time: what drops it once it has been kept long enough."""
    return tombstone_prefix(partition) + b"%015d/%s" % (expired_ms, run_id.encode())


def rejected_prefix(partition: int) -> bytes:
    return b"R/%05d/" % partition


def rejected_key(partition: int, rejected_ms: int, run_id: str) -> bytes:
    """A run its create's rejection deleted before it was admitted, by the rejection's log
    time -> the rejection's offset: what drops its history once the tombstone retention
    has passed (the rest of it went with the run)."""
    return rejected_prefix(partition) + b"%015d/%s" % (rejected_ms, run_id.encode())


def caused_prefix(partition: int, run_id: str) -> bytes:
    return b"y/%05d/%s\x00" % (partition, run_id.encode())


def caused_key(partition: int, run_id: str, request_id: str) -> bytes:
    """An unacknowledged outbox entry by the run whose record caused it."""
    return caused_prefix(partition, run_id) + request_id.encode()


def outbox_key(partition: int, request_id: str) -> bytes:
    return outbox_prefix(partition) + request_id.encode()


# The layout's version: a store written by an older layout is rebuilt from the journal
# (projections.store), since indexes it lacks (settle times, causes) cannot be derived
# from what it holds. 3: the run-keyed families carry their partition. 4: a child a later
# round spawned is placed by its own lineage (projections.store_migrate moves a format 3
# store's keys in place).
# 5: a round after the first that handed off is in the settle index, by its handoff
# (projections.store_migrate indexes a format 4 store's in place).
FORMAT_KEY = b"m/format"
STORE_FORMAT = b"5"
ROUNDS_UNINDEXED_FORMAT = b"4"
PLACED_BY_ROOT_FORMAT = b"3"
# The journal's partition count, which places every run-keyed key: set once, when the
# store's owner first learns it (projections.store).
PARTITIONS_KEY = b"m/partitions"
# A read model's query index (projections.query_index): one written before it, or by an
# older form of it, is rebuilt the same way (a worker's store keeps none).
QUERY_FORMAT_KEY = b"m/query-format"
QUERY_FORMAT = b"2"  # 2: -0.0 is indexed as 0.0
# A read model's query index (projections.query_index lays out the rest of its keys).
QUERY_INDEX_PREFIX = b"z/"
