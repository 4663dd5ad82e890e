"""runstream.projections: everything pure, plus its storage.

The run-state reducer `apply(state, record) -> state` (reducer, transitions, requests,
outbox_requests, poison), the owner's decisions (decide: they return records), the replay
of a run's history (replay), fork planning (forks, fork_plan), the values a store holds
(stored), the RocksDB store (store, store_reads) and its writes (writes, keys, manifest,
checkpoints), the in-memory projection (memory), and rebuild of a given record stream
(rebuild). It imports only `runstream.engine.journal` and `runstream.engine.errors`: no Kafka
client, no clock, and rocksdict only in `store` and `writes` (.importlinter checks it).
"""

if __name__ == "projections":  # imported by its name before runstream 0.2: a deprecated alias
    from runstream._legacy import adopt

    adopt(__name__)
