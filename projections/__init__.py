"""runstream.projections: everything pure, plus its storage.

The run-state reducer `apply(state, record) -> state`, the owner's decisions (they return
records), fork planning, the RocksDB store and its writes, and rebuild of a given record
stream. It imports only `runstream.engine.journal` and `runstream.engine.errors`: no Kafka
client, no clock, and rocksdict only in `store` and `writes`.
"""

if __name__ == "projections":  # imported by its name before runstream 0.2: a deprecated alias
    from runstream._legacy import adopt

    adopt(__name__)
