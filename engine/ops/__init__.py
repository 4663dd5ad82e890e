"""Operating a namespace: rebuild a projection from the journal (`rebuild`: the Kafka reading;
the fold is `projections.fold`'s), verify a projection against its rebuild and diff the
two (`verify`, `verify_diff`), fold partitions in parallel (`shards`), list dead letters
(`deadletters`).

May import: `engine.worker`, `engine.client`, `engine.readmodel`, `engine.flow`,
`engine.kafka`, `projections`, `engine.journal`, `engine.errors`, `engine.config`; never
the CLI or the UI.
"""
