"""The read model: a RocksDB projection of a whole namespace that answers queries, its
view, its Kafka source, how runs look to an operator, and the lookups the CLI and UI share.
"""
