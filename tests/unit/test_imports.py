"""Imports run one way (engine.journal <- projections <- engine runtime <- engine.cli):
every module imports on its own, first, in a fresh interpreter, and importing the engine
changes nothing in its dependencies."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _modules() -> list[str]:
    found = []
    for package in ("projections", "engine"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "__main__.py":
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


# A fresh interpreter per module costs about a second each, most of it importing the
# third-party packages. So one interpreter imports only those, then forks one child per module
# of ours: each child still imports that module first, before any other of ours.
_FORK_EACH = """
import importlib, json, os, sys, traceback
for dependency in ("aiokafka", "rocksdict", "fastavro", "pydantic", "click", "msgspec",
                   "aiohttp", "opentelemetry.trace"):
    try:
        importlib.import_module(dependency)
    except ImportError:
        pass
assert not [m for m in sys.modules if m.split(".")[0] in ("engine", "projections")]
def start(module):
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read)
        try:
            importlib.import_module(module)
            error = ""
        except BaseException:
            error = traceback.format_exc()[-2000:]
        os.write(write, error.encode())
        os._exit(0)
    os.close(write)
    return module, child, read
def finish(module, child, read):
    with os.fdopen(read, "rb") as pipe:
        error = pipe.read().decode()
    _, status = os.waitpid(child, 0)
    if status != 0 and not error:
        error = f"the child exited with status {status}"
    print(json.dumps({"module": module, "error": error}), flush=True)
modules, width = sys.argv[1:], os.cpu_count() or 1
for at in range(0, len(modules), width):
    for started in [start(module) for module in modules[at:at + width]]:
        finish(*started)
"""


@pytest.fixture(scope="module")
def import_errors() -> dict[str, str]:
    """Module -> the traceback of importing it first (empty when it imported)."""
    done = subprocess.run([sys.executable, "-c", _FORK_EACH, *_modules()], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    return {row["module"]: row["error"] for row in rows}


@pytest.mark.parametrize("module", _modules())
def test_every_module_imports_first_on_its_own(module: str,
                                               import_errors: dict[str, str]) -> None:
    assert module in import_errors, "the importing process ended before this module"
    assert import_errors[module] == "", import_errors[module]


def test_importing_the_engine_patches_nothing_in_aiokafka() -> None:
    script = (
        "import aiokafka.producer.sender as s; before = s.BACKOFF_OVERRIDE\n"
        "import engine, engine.worker, engine.client.client, engine.cli\n"
        "from engine import Worker, Client\n"
        "assert s.BACKOFF_OVERRIDE == before, (before, s.BACKOFF_OVERRIDE)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
