"""The pure run-state reducer, the RocksDB store, rebuild and time travel."""
