"""The test environment is light: importing it (and the pytest plugin, which pytest imports in
every run on a machine where runstream is installed) loads no Kafka client, no RocksDB and
no web server. Each check runs in a fresh interpreter, so what other tests imported does not
count; on failure it prints the chain of imports that brought the module in."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

HEAVY = ("aiokafka", "rocksdict", "aiohttp")

# Imports `modules` in a fresh interpreter and prints, as JSON, the runstream modules it
# loaded and, for each heavy package it loaded, the chain of files whose imports did it.
PROBE = """
import importlib, json, sys, traceback
heavy, modules = {heavy!r}, {modules!r}
chains = {{}}

class Spy:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in heavy and top not in chains:
            files = [f"{{f.filename}}:{{f.lineno}}" for f in traceback.extract_stack()[:-1]
                     if not f.filename.startswith("<")]
            chains[top] = files[1:]  # (the probe itself first)
        return None

sys.meta_path.insert(0, Spy())
for module in modules:
    importlib.import_module(module)
print(json.dumps({{"loaded": sorted(m for m in sys.modules if m.startswith("runstream")),
                  "heavy": {{top: chains.get(top, ["?"]) for top in heavy
                            if top in sys.modules}}}}))
"""


def probe(*modules: str) -> dict[str, object]:
    code = PROBE.format(heavy=HEAVY, modules=modules)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def chains(heavy: object) -> str:
    assert isinstance(heavy, dict)
    return "\n".join(f"{top} imported by:\n    " + "\n    ".join(reversed(files))
                     for top, files in heavy.items())


def test_importing_the_test_environment_loads_no_kafka_client_store_or_web_server() -> None:
    found = probe("runstream.testing", "runstream.engine.testing",
                  "runstream.engine.testing.plugin")
    assert "runstream.engine.testing.env" in found["loaded"]  # (the probe imported it)
    assert found["heavy"] == {}, chains(found["heavy"])


def test_the_pytest_plugin_loads_nothing_until_its_fixture_is_used() -> None:
    found = probe("runstream.engine.testing.plugin")
    assert found["heavy"] == {}, chains(found["heavy"])
    assert found["loaded"] == ["runstream", "runstream.engine", "runstream.engine.testing",
                               "runstream.engine.testing.plugin"]


def test_the_send_limit_has_one_definition_the_worker_and_environment_share() -> None:
    """A worker's committer and the TestEnvironment bound what they send by the one
    MAX_SENT_RECORD_BYTES of engine.journal.record_size: no module defines its own copy
    (a name assigned that value, or the name assigned anything)."""
    import runstream
    from runstream.engine.journal import record_size

    limit = record_size.MAX_SENT_RECORD_BYTES
    root = Path(runstream.__file__).parent
    found = []
    for path in sorted([*(root / "engine").rglob("*.py"), *(root / "projections").rglob("*.py")]):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            value = node.value.value if isinstance(node.value, ast.Constant) else None
            if "MAX_SENT_RECORD_BYTES" in names or (names and value == limit):
                found.append(path.relative_to(root).as_posix())
    assert found == ["engine/journal/record_size.py"]
