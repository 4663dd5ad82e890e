"""Operating a namespace: verify a projection against its rebuild and diff the two (`verify`,
`verify_diff`), fold partitions in parallel (`shards`), list dead letters (`deadletters`);
planned: `rebuild`, the Kafka half of a rebuild (reading the records that
`projections.rebuild` folds).

May import: `engine.worker`, `engine.client`, `engine.readmodel`, `engine.flow`,
`engine.kafka`, `projections`, `engine.journal`, `engine.errors`, `engine.config`,
`engine.timetext`; never the CLI or the UI.
"""
