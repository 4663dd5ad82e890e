"""runstream.engine: I/O and the faces users touch, one package per concern.

| package | holds |
| --- | --- |
| `journal` | records: events (generated), codec, schema ids, codegen, limits, time text |
| `kafka` | drivers: connection, admin, ACLs, reader, requests topic, Confluent registry client |
| `flow` | Flow, its context and waits, the journal port, the handler runner, `--app` loading |
| `client` | Client, RunHandle, the shared tail reader |
| `readmodel` | the read model behind every query: model, view, source, describe, rows |
| `worker` | the consumer-group member that owns partitions and executes runs; the relay |
| `timetravel` | history, points, the cut (`state --at`), fork (I/O half), fencing, dry run |
| `ops` | rebuild (the Kafka half), verify and its diff, shards, dead letters |
| `cli`, `ui` | the command line and the web UI: on top, imported by no library package |
| `testing` | TestEnvironment and its pytest plugin (no Kafka client) |
| `observability` | Prometheus metrics and OpenTelemetry spans |
| `broker`, `demo` | a local single-node Kafka broker; the demo |

Modules directly here (at most 8): `config` (namespace, bootstrap, topic names, defaults)
and `errors` (what users catch).

Layer rule: `runstream.projections` (pure, plus its storage) imports only `engine.journal` and
`engine.errors`. The engine packages stack one way, each importing only those below it:
`cli`; `ui`, `demo`, `testing`; `ops`, `timetravel`; `worker`, `client`; `readmodel`;
`flow`; `kafka`, `observability`, `broker`; then `projections`, `journal`, and `errors`,
`config`. No import cycle between two packages. The contracts are checked by
import-linter (`.importlinter`, run by scripts/test.sh). Users import `runstream`, not this.
"""

if __name__ == "engine":  # imported by its name before runstream 0.2: a deprecated alias
    from runstream._legacy import adopt

    adopt(__name__)
