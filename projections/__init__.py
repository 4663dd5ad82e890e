"""runstream.projections: everything pure, plus its storage.

The projected state (`state`), the pure reducer `apply(partition, run, record, offset)`
(`reducer`, with `transitions`, `requests`, `outbox_requests`, `forks`), poison-record
reasons (`poison`), the owner's decisions (`decide`, `capabilities`, `outbox_fallback`; they
return records), which partition holds a run (`partitioning`), the replay of a run's history
(`replay`), fork planning (`fork_plan`), the fold of one record (`projector`), the values a
store holds (`stored`), the RocksDB store (`store`, `store_reads`) and its writes (`writes`,
`keys`), the in-memory projection (`memory`), checkpoints (`manifest`, `checkpoints`) and
rebuild of a given record stream (`rebuild`).

May import: `runstream.engine.journal` and `runstream.engine.errors` only: no Kafka client,
no clock, and rocksdict only in `store` and `writes` (`.importlinter` checks it).
"""

if __name__ == "projections":  # imported by its name before runstream 0.2: a deprecated alias
    from runstream._legacy import adopt

    adopt(__name__)
