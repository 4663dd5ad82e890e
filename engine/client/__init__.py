"""The client: `Client` creates runs and reads them (`client`), `RunHandle` waits for one
(`handle`), and the shared tail reader follows the journal for their answers (`tail`). No
server needed.

May import: `engine.readmodel`, `engine.flow`, `engine.kafka`, `engine.observability`,
`projections`, `engine.journal`, `engine.errors`, `engine.config`; never the worker.
"""
