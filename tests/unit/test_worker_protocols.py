"""The worker's helpers hold narrow protocols (engine.worker.partition_protocols, run_protocols and
helper_protocols), not the Worker: no helper module imports engine.worker.worker (not even
under TYPE_CHECKING), and no module of the package reaches another object's underscore
attributes. That the Worker satisfies each protocol is checked by mypy where it hands
itself to its helpers."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import runstream.engine.worker as worker_package

WORKER_DIR = Path(worker_package.__file__).parent
WORKER_MODULE = "runstream.engine.worker.worker"
# The Worker itself, and the package's lazy export of it.
MAY_IMPORT_WORKER = {"worker.py", "__init__.py"}
# aiokafka keeps the group generation only in its private coordinator, and sends a group
# request only through it (a thin driver's documented exceptions:
# engine.worker.kafka_driver.group_generation and group_heartbeat).
# sys._current_frames is CPython's documented way to read another thread's stack (the
# watchdog's stall sampler; faulthandler's Python-level twin).
PRIVATE_READS_ALLOWED = {("kafka_driver.py", "_coordinator"), ("kafka_driver.py", "_send_req"),
                         ("watchdog.py", "_current_frames")}
# What the helpers ask of the worker (partition_protocols, run_protocols) and of one another.
PROTOCOL_MODULES = ("partition_protocols.py", "run_protocols.py", "helper_protocols.py")


def _modules(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.py"))


def worker_imports(directory: Path) -> list[str]:
    """`module:line` of every import of engine.worker.worker outside MAY_IMPORT_WORKER."""
    found = []
    for path in _modules(directory):
        if path.name in MAY_IMPORT_WORKER:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if WORKER_MODULE in names:
                found.append(f"{path.name}:{node.lineno}")
    return found


def foreign_private_reads(directory: Path) -> list[str]:
    """`module:line attribute` of every `x._name` whose `x` is not `self` or `cls`."""
    found = []
    for path in _modules(directory):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
                continue
            if node.attr.startswith("__") or (path.name, node.attr) in PRIVATE_READS_ALLOWED:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            found.append(f"{path.name}:{node.lineno} {node.attr}")
    return found


def test_no_helper_imports_the_worker() -> None:
    assert worker_imports(WORKER_DIR) == []


def test_no_module_reaches_another_objects_private_state() -> None:
    assert foreign_private_reads(WORKER_DIR) == []


@pytest.mark.parametrize("module", PROTOCOL_MODULES)
def test_the_owner_protocols_import_no_helper_that_holds_them(module: str) -> None:
    """The protocol modules import only leaf modules, so no cycle hides behind them."""
    tree = ast.parse((WORKER_DIR / module).read_text())
    imported = {node.module for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module}
    helpers = {f"runstream.engine.worker.{name}" for name in (
        "worker", "claims", "upkeep", "timers", "outbox", "observe", "executor",
        "activation", "reactions", "forks", "sweep")}
    assert imported & helpers == set()
