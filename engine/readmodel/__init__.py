"""The read model behind every query: `model` (a RocksDB projection of a whole namespace that
catches up from the offsets it stored), `view` (reading it), `source` (its Kafka source),
`describe` (how a run looks to an operator: status, waits, evidence), `rows` (a run's
history as people read it) and `lookups` (what the CLI and the UI share).

May import: `engine.flow`, `engine.kafka`, `projections`, `engine.journal`, `engine.errors`,
`engine.config`; below the client and time travel, which read from it.
"""
