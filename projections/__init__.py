"""runstream.projections: everything pure, plus its storage.

The projected state (`state`), the pure reducer `apply(partition, run, record, offset)`
(`reducer`, with `transitions`, `requests`, `forks`), poison-record reasons (`poison`), the
owner's decisions (`decide`, `capabilities`, `outbox_fallback`), which partition holds a
run (`partitioning`), the fold of one record (`projector`), the RocksDB store and its writes
(`store`, `writes`, `keys`), the in-memory projection (`memory`), checkpoints (`manifest`,
`checkpoints`) and rebuild of a given record stream (`rebuild`). Planned: `owner` (the
owner's reactions, one pure function the worker and TestEnvironment both call), `replay` and
`fork_plan` (pure history replay and fork planning).

May import: `runstream.engine.journal` and `runstream.engine.errors` only: no Kafka client,
no clock, and rocksdict only in `store` and `writes`.
"""

if __name__ == "projections":  # imported by its name before runstream 0.2: a deprecated alias
    from runstream._legacy import adopt

    adopt(__name__)
