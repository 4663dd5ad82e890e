"""The read model: a RocksDB projection of a whole namespace that answers queries, its
view, its Kafka source, how runs look to an operator (`describe`; a run's history as people
read it, `rows`), and the lookups the CLI and UI share.

May import: flow, kafka, projections, journal, errors, config; never client or timetravel
(they import it).
"""
