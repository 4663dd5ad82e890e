#!/usr/bin/env bash
# The demo on a fresh machine: set up (.venv, Kafka jars), start the local broker if none
# answers, create a journal, start two workers, run a few hundred checkouts, show one run's
# history and its state at an earlier offset, then waits, children, rounds, a quarantine,
# a run's whole life (limits by flow name, cancels with cleanup), retries, timeouts, a
# schedule, signal-with-start, per-flow concurrency, attributes and queries, an update, a
# batch cancel by query, debugging and poison records, and a rolling restart that a long
# irreversible step outlives. Extra args go to `runstream demo`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/bootstrap.sh
exec .venv/bin/runstream demo "$@"
