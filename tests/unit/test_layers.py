"""The import contracts (.importlinter): the tree keeps them, and a forbidden import breaks them.

Each breach is added to a copy of the package (engine/ and projections/ laid under a
temporary runstream/), and `lint-imports` runs on that copy: it must fail, naming the
contract the import breaks. An import under `if TYPE_CHECKING:` counts like any other.
"""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_LINT = ("import sys\n"
         "from importlinter.cli import lint_imports\n"
         "sys.exit(lint_imports('.importlinter', no_cache=True, no_logo=True))\n")

PROJECTIONS_PURE = ("projections imports no Kafka or HTTP client and no engine package but "
                    "journal and errors")
NO_CLI = "library code never imports engine.cli, engine.ui or engine.demo"
PURE_CORE = "the reducer, decisions, planning and the in-memory projection never reach rocksdict"
ROCKSDICT = "rocksdict is imported in projections only by projections.store"
TESTING_LIGHT = ("the test environment (and its pytest plugin) imports no Kafka client, "
                 "rocksdict or aiohttp")
LAYERS = "the stack runs one way: cli, faces, engine packages, projections, journal, errors"
ACYCLIC = "no import cycle between two packages (cycles inside one package are allowed)"
PLACED = "every package and module of engine has its place in the stack"
TYPE_CHECKING_IMPORT = ("from typing import TYPE_CHECKING as _TYPE_CHECKING\n"
                        "if _TYPE_CHECKING:\n"
                        "    from runstream.engine.client.client import Client  # noqa: F401\n")


def _lint(tree: Path) -> tuple[int, str]:
    """lint-imports on the `runstream` package found first under `tree`: (exit code, its
    output with line breaks folded, as it wraps long contract names)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, "-c", _LINT], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=120)
    return done.returncode, " ".join((done.stdout + done.stderr).split())


def _copy_tree(into: Path) -> Path:
    """The package as the wheel lays it out (runstream/engine, runstream/projections), real
    files in place of the repository's links, and the contracts beside it."""
    skip = shutil.ignore_patterns("__pycache__", "static", "*.xml", "*.properties")
    package = into / "runstream"
    package.mkdir()
    for module in (ROOT / "runstream").glob("*.py"):
        shutil.copy(module, package / module.name)
    shutil.copytree(ROOT / "engine", package / "engine", ignore=skip)
    shutil.copytree(ROOT / "projections", package / "projections", ignore=skip)
    shutil.copy(ROOT / ".importlinter", into / ".importlinter")
    return into


def test_the_tree_keeps_every_contract() -> None:
    code, out = _lint(ROOT)
    assert code == 0, out
    assert "0 broken" in out
    for contract in (PROJECTIONS_PURE, NO_CLI, PURE_CORE, ROCKSDICT, TESTING_LIGHT, LAYERS,
                     ACYCLIC, PLACED):
        assert f"{contract} KEPT" in out, contract


def test_the_copy_keeps_them_too(tmp_path: Path) -> None:
    """What the breach cases below start from: the copy itself breaks nothing."""
    code, out = _lint(_copy_tree(tmp_path))
    assert code == 0, out


@pytest.mark.parametrize(("module", "added", "broken", "detail"), [
    ("projections/state.py", "import aiokafka  # noqa: F401\n", [PROJECTIONS_PURE],
     "runstream.projections is not allowed to import aiokafka"),
    ("projections/reducer.py", "from runstream.engine.kafka import reader  # noqa: F401\n",
     [PROJECTIONS_PURE, LAYERS], "runstream.projections is not allowed to import "
     "runstream.engine.kafka"),
    ("engine/readmodel/model.py", "from runstream.engine.cli import operations  # noqa: F401\n",
     [NO_CLI, LAYERS], "runstream.engine.readmodel is not allowed to import "
     "runstream.engine.cli"),
    ("projections/memory.py", "from runstream.projections import store  # noqa: F401\n",
     [PURE_CORE], "runstream.projections.memory is not allowed to import rocksdict"),
    ("projections/keys.py", "import rocksdict  # noqa: F401\n", [ROCKSDICT, PURE_CORE],
     "runstream.projections is not allowed to import rocksdict"),
    ("engine/testing/execution.py", "import aiohttp  # noqa: F401\n", [TESTING_LIGHT],
     "runstream.engine.testing is not allowed to import aiohttp"),
    # The client imports the read model: a read-model import of the client, if only for
    # its type, would close a cycle between the two packages.
    ("engine/readmodel/model.py", TYPE_CHECKING_IMPORT, [LAYERS, ACYCLIC],
     "runstream.engine.readmodel is not allowed to import runstream.engine.client"),
])
def test_a_forbidden_import_breaks_its_contract(tmp_path: Path, module: str, added: str,
                                                broken: list[str], detail: str) -> None:
    tree = _copy_tree(tmp_path)
    target = tree / "runstream" / module
    target.write_text(target.read_text() + "\n" + added)
    code, out = _lint(tree)
    assert code != 0, out
    for contract in broken:
        assert f"{contract} BROKEN" in out, (contract, out)
    assert detail in out, out


def test_a_new_engine_package_must_be_placed_in_the_stack(tmp_path: Path) -> None:
    tree = _copy_tree(tmp_path)
    package = tree / "runstream" / "engine" / "scheduler"
    package.mkdir()
    (package / "__init__.py").write_text('"""A package nobody placed."""\n')
    code, out = _lint(tree)
    assert code != 0, out
    assert f"{PLACED} BROKEN" in out, out
    assert "runstream.engine.scheduler" in out, out


MAX_MODULE_LINES = 450
MAX_ENGINE_MODULES = 8  # directly in engine/: the rest live in its packages


def test_no_module_is_over_450_lines() -> None:
    generated = {"engine/journal/events.py"}
    paths = [*(ROOT / "engine").rglob("*.py"), *(ROOT / "projections").rglob("*.py"),
             *(ROOT / "runstream").glob("*.py")]  # (runstream/engine links to engine/)
    long = {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for path in paths
            if str(path.relative_to(ROOT)) not in generated}
    assert len(long) > 100  # every module was read
    over = {name: lines for name, lines in long.items() if lines > MAX_MODULE_LINES}
    assert not over, over


def test_engine_holds_at_most_8_modules_directly() -> None:
    modules = sorted(path.name for path in (ROOT / "engine").glob("*.py"))
    assert len(modules) <= MAX_ENGINE_MODULES, modules


# They open or fill a RocksDB store.
STORAGE_MODULES = {"store", "store_batch", "store_migrate", "store_restore", "store_runs",
                   "store_secondary", "checkpoints", "fold"}


def test_every_projections_module_is_pure_or_named_storage() -> None:
    """A new module of projections must join the pure-core contract (or the storage set):
    the contract lists its sources by hand, so one left out would escape it."""
    config = configparser.ConfigParser()
    config.read(ROOT / ".importlinter")
    pure = {name.rsplit(".", 1)[-1] for name in
            config["importlinter:contract:pure-core-without-rocksdb"]["source_modules"].split()}
    modules = {p.stem for p in (ROOT / "projections").glob("*.py") if p.stem != "__init__"}
    assert modules - STORAGE_MODULES == pure, (modules - STORAGE_MODULES) ^ pure
