#!/usr/bin/env bash
# Lint, type-check and run the tests against a real Kafka broker.
#
#   scripts/test.sh [pytest args...]
#
# Uses the broker at $RUNSTREAM_BOOTSTRAP (default 127.0.0.1:9092). If nothing answers there,
# starts the local single-node broker (`runstream broker start`) and stops it on exit, pass or
# fail. The exit code is pytest's; "no tests collected" (5) counts as a failure, and so does a
# lint, type or import-contract (.importlinter) error when the tests pass.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# shellcheck source=scripts/steps.sh
. scripts/steps.sh

# .ci/run has just done (and timed) this; elsewhere it makes a fresh checkout usable.
if [ "${RUNSTREAM_SKIP_BOOTSTRAP:-0}" != 1 ]; then
    step bootstrap bash scripts/bootstrap.sh
fi
export VIRTUAL_ENV="$PWD/.venv"
export PATH="$VIRTUAL_ENV/bin:$PATH"

BOOTSTRAP="${RUNSTREAM_BOOTSTRAP:-127.0.0.1:9092}"
export RUNSTREAM_BOOTSTRAP="$BOOTSTRAP"

answering() {
    python -c 'import sys
from runstream.engine.broker.probe import is_answering
sys.exit(0 if is_answering(sys.argv[1], 3.0) else 1)' "$1"
}

broker_start_pid=""
broker_log=$(mktemp)
cleanup() {
    local rc=$?
    if [ -n "$broker_start_pid" ]; then
        wait "$broker_start_pid" 2>/dev/null || true
        step broker-stop runstream broker stop || true
    fi
    rm -f "$broker_log"
    exit "$rc"
}
trap cleanup EXIT
# Make INT/TERM (Ctrl-C, a cancelled CI job) exit through the EXIT trap, stopping the broker.
trap 'exit 130' INT
trap 'exit 143' TERM

if answering "$BOOTSTRAP"; then
    echo "using the broker at $BOOTSTRAP" >&2
else
    host=${BOOTSTRAP%:*}
    port=${BOOTSTRAP##*:}
    case "$host" in
        127.0.0.1|localhost) ;;
        *)
            echo "error: nothing answers at $BOOTSTRAP and it is not a local address" >&2
            exit 1
            ;;
    esac
    echo "nothing answers at $BOOTSTRAP: starting the local broker (stopped on exit)" >&2
    # In the background, so the JVM boots while ruff and mypy run.
    step broker-start runstream broker start --port "$port" >"$broker_log" 2>&1 &
    broker_start_pid=$!
fi

# Lint, type and layer errors fail the run, after the tests have run (so one run shows both).
checks_failed=0
step ruff ruff check engine projections tests bench runstream/*.py || checks_failed=1
step mypy mypy || checks_failed=1
step lint-imports lint-imports --no-cache --no-logo || checks_failed=1  # .importlinter

if [ -n "$broker_start_pid" ]; then
    if ! wait "$broker_start_pid"; then
        broker_start_pid=""  # it cleaned up after itself
        cat "$broker_log" >&2
        echo "error: the local broker did not start" >&2
        exit 1
    fi
    grep '^step ' "$broker_log" || true
    echo "broker ready at $(grep -v '^step ' "$broker_log" | tail -n 1)" >&2
    # Still ours to stop; wait in cleanup is then a no-op.
fi

# Three pytest processes on two cores: most tests wait on the broker, a timer or a session
# timeout, not the CPU (the whole suite took 726-747 s with three against 978 s with two, on
# this 2-core machine, with no test failing). A test file stays in one process (its module
# fixtures are shared); every test has its own namespace, so the processes share the broker
# as tests in one process do. RUNSTREAM_TEST_PROCESSES=0 runs them in this process.
processes="${RUNSTREAM_TEST_PROCESSES:-3}"
parallel=()
if [ "$processes" -gt 0 ]; then
    parallel=(-n "$processes" --dist loadfile)
fi
pytest_rc=0
step pytest pytest -q -ra "${parallel[@]}" "$@" || pytest_rc=$?
if [ "$pytest_rc" -eq 5 ]; then
    echo "error: pytest collected no tests" >&2
    exit 5
fi
if [ "$pytest_rc" -ne 0 ]; then
    exit "$pytest_rc"
fi
if [ "$checks_failed" -ne 0 ]; then
    echo "error: tests passed but ruff, mypy or lint-imports failed (see above)" >&2
    exit 1
fi
