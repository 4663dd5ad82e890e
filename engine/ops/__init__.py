"""Operating a namespace: rebuild a projection from the journal (`rebuild`: the Kafka reading;
the fold is projections.rebuild's), verify a projection against its rebuild and diff the two,
fold shards in parallel, list and replay dead letters.

May import: the kafka, readmodel and worker packages, projections, journal, errors, config.
"""
