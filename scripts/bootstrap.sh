#!/usr/bin/env bash
# Idempotent developer/CI setup: .venv (Python >= 3.11), runstream installed editable with its
# test extras, and the Kafka jars for the local broker fetched into the cache (once).
# Re-running is cheap: pip runs again only when pyproject.toml changed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# shellcheck source=scripts/steps.sh
. scripts/steps.sh

find_python() {
    local candidate
    for candidate in "${PYTHON:-}" python3.13 python3.12 python3.11 python3; do
        [ -n "$candidate" ] || continue
        command -v "$candidate" >/dev/null 2>&1 || continue
        if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            echo "$candidate"
            return 0
        fi
    done
    return 1
}

if [ ! -x .venv/bin/python ]; then
    if ! python=$(find_python); then
        echo "error: Python 3.11 or newer not found (set PYTHON=/path/to/python3.11+)" >&2
        exit 1
    fi
    echo "creating .venv with $python ($("$python" --version 2>&1))" >&2
    step venv "$python" -m venv .venv
fi

# pip is skipped when the installed project matches this pyproject.toml.
stamp=.venv/.runstream-installed
wanted=$(.venv/bin/python -c 'import hashlib; print(hashlib.sha256(open("pyproject.toml", "rb").read()).hexdigest())')
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$wanted" ]; then
    echo "installing runstream (editable) with test extras into .venv" >&2
    step pip-install .venv/bin/python -m pip install --quiet --disable-pip-version-check \
        -e '.[test]'
    echo "$wanted" > "$stamp"
fi

# Fetch the Kafka jars for `runstream broker start` (no-op when the cache is complete).
provision_kafka() { .venv/bin/runstream broker provision >/dev/null; }
step kafka-jars provision_kafka

# Headless Chromium for the UI tests (tests/ui): Debian's package, which Playwright drives
# through executable_path (Playwright's own browser download is not used). Installed once,
# when missing; without apt-get or root, a warning says what to install.
provision_chromium() {
    local chromium=${RUNSTREAM_CHROMIUM:-/usr/bin/chromium} sudo="" log
    [ -x "$chromium" ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 && sudo="sudo -n"
    fi
    if ! command -v apt-get >/dev/null 2>&1 || { [ "$(id -u)" -ne 0 ] && [ -z "$sudo" ]; }; then
        echo "warning: $chromium is missing; install Chromium (Debian: apt-get install" \
            "chromium) or set RUNSTREAM_CHROMIUM, or the UI tests fail under CI" >&2
        return 0
    fi
    echo "installing Debian's chromium for the UI tests (apt-get)" >&2
    log=$(mktemp)
    if ! { $sudo apt-get update -qq &&
            $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } \
            >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        echo "error: apt-get could not install chromium" >&2
        return 1
    fi
    rm -f "$log"
}
step chromium provision_chromium
