"""Imports run one way (engine.journal <- projections <- engine runtime <- engine.cli):
every module imports on its own, first, in a fresh interpreter, and importing the engine
changes nothing in its dependencies."""

from __future__ import annotations

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


@pytest.mark.parametrize("module", _modules())
def test_every_module_imports_first_on_its_own(module: str) -> None:
    done = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]


def test_importing_the_engine_patches_nothing_in_aiokafka() -> None:
    script = (
        "import aiokafka.producer.sender as s; before = s.BACKOFF_OVERRIDE\n"
        "import engine, engine.worker, engine.client, engine.cli\n"
        "from engine import Worker, Client\n"
        "assert s.BACKOFF_OVERRIDE == before, (before, s.BACKOFF_OVERRIDE)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
