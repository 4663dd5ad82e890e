"""runstream.projections: everything pure, plus its storage.

The projected state (`state`), the pure reducer `apply(partition, run, record, offset)`
(`reducer`, with `transitions`, `requests`, `outbox_requests`, `fork_transitions`),
poison-record reasons (`poison`); the owner: its reactions to an applied record (`owner`,
one function the worker and the TestEnvironment both carry out) and its decisions
(`decide`, `wakes`, `capabilities`, `outbox_fallback`; they return records) and how a
write is carried out (`sending`: what answers a record too large to send); which
partition holds a run (`partitioning`), the replay of a run's history (`replay`), fork
planning (`fork_plan`), the fold of one record (`projector`); storage: the values a store
holds (`values`), the RocksDB store (`store`, with `indexes`) and its writes (`writes`,
`keys`), the in-memory projection (`memory`), checkpoints (`manifest`, `checkpoints`) and
the fold of a given record stream (`fold`: rebuild and verify).

May import: `runstream.engine.journal` and `runstream.engine.errors` only: no Kafka client,
no clock, and rocksdict only in `store` (`.importlinter` checks it).
"""

if __name__ == "projections":  # imported by its name before runstream 0.2: a deprecated alias
    from runstream._legacy import adopt

    adopt(__name__)
