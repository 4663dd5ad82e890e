"""runstream.engine: I/O and the faces users touch, one package per concern.

| package | holds |
| --- | --- |
| `journal` | records: events (generated), codec, schema ids, codegen, size and input limits |
| `kafka` | drivers: connection, admin, ACLs, reader, requests topic, Confluent registry client |
| `flow` | Flow, its context, waits, the journal port, the handler runner, loading an `--app` |
| `client` | Client, RunHandle, the shared tail reader |
| `readmodel` | the read model, its view, its Kafka source, the lookups the CLI and UI share |
| `worker` | the consumer-group member that owns partitions and executes runs; the relay |
| `timetravel` | history, points, the cut (`state --at`), fork, fencing ledger, dry run |
| `ops` | verify and rebuild, diff, shards, dead letters |
| `cli`, `ui` | the command line and the web UI |
| `testing`, `observability` | TestEnvironment and its pytest plugin; metrics and tracing |
| `broker`, `demo` | a local single-node Kafka broker; the demo |

Layer rule: `runstream.projections` (pure, plus its storage) imports only `engine.journal` and
`engine.errors`; every package here may import `projections`, `journal`, `errors` and
`config`; `cli` and `ui` sit on top and nothing in a library package imports them. The
contracts are checked by import-linter (`.importlinter`, run by scripts/test.sh).
"""

if __name__ == "engine":  # imported by its name before runstream 0.2: a deprecated alias
    from runstream._legacy import adopt

    adopt(__name__)
