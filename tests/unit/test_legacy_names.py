"""runstream/_legacy.py: the old top-level names `engine` and `projections` are aliases of the
new modules, with one DeprecationWarning per process, and a user's own package of that name
is never taken over. Each case runs in a fresh interpreter (the alias is per process)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, cwd: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, *args, "-c", textwrap.dedent(code)], cwd=cwd,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_old_names_are_the_new_modules_with_one_warning(tmp_path: Path) -> None:
    out = _python("""
        import json, warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from engine import Client, Flow
            import projections.state
            import engine.worker
            import engine.journal
            from engine import errors
        import importlib.resources
        import runstream, runstream.engine.journal, runstream.projections.state
        print(json.dumps({
            "warnings": [(str(w.message), w.filename) for w in caught
                         if issubclass(w.category, DeprecationWarning)],
            "same": [Client is runstream.Client, Flow is runstream.Flow,
                     engine.worker.Worker is runstream.Worker,
                     projections.state is runstream.projections.state,
                     errors is runstream.engine.errors,
                     projections.state.RunStatus is runstream.RunStatus],
            # the real module keeps its own spec: resources and reload still work
            "spec": runstream.engine.journal.__spec__.name,
            "resources": bool(list(importlib.resources.files(
                "runstream.engine.journal").iterdir())),
            # `import engine.worker` binds on the alias, not in runstream's namespace
            "polluted": sorted({"worker", "journal", "testing"} & set(vars(runstream))),
        }))
    """, tmp_path)
    found = json.loads(out)
    assert len(found["warnings"]) == 1, found["warnings"]
    message, filename = found["warnings"][0]
    assert "deprecated" in message and "from runstream import" in message
    assert filename == "<string>"  # the line that imported the old name, not runstream's
    assert found["same"] == [True] * 6
    assert found["spec"] == "runstream.engine.journal"
    assert found["resources"] is True
    assert found["polluted"] == []


def test_the_warning_is_shown_by_default_for_a_script_that_imports_engine(
        tmp_path: Path) -> None:
    script = tmp_path / "old_script.py"
    script.write_text("from engine import Client\nimport projections.state\nprint('ok')\n")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
    assert done.stderr.count("DeprecationWarning") == 1, done.stderr
    assert f"{script}:1: DeprecationWarning" in done.stderr, done.stderr


def test_a_users_own_engine_package_first_on_sys_path_is_never_taken_over(
        tmp_path: Path) -> None:
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "__init__.py").write_text("MINE = True\n")
    (tmp_path / "engine" / "worker.py").write_text("Worker = 'my own worker'\n")
    out = _python("""
        import json, sys, warnings
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import runstream
            from runstream import Client, Worker
            from runstream.testing import TestEnvironment
            import engine, engine.worker
            import projections.state   # runstream's old name: still an alias beside it
        print(json.dumps({
            "mine": engine.MINE, "worker": engine.worker.Worker,
            "engine_file": engine.__file__,
            "projections": projections.state is sys.modules["runstream.projections.state"],
            "warnings": len([w for w in caught if issubclass(w.category, DeprecationWarning)]),
        }))
    """, tmp_path)
    found = json.loads(out)
    assert found["mine"] is True and found["worker"] == "my own worker"
    assert found["engine_file"] == str(tmp_path / "engine" / "__init__.py")
    assert found["projections"] is True and found["warnings"] == 1


def test_runstream_itself_imports_no_old_name(tmp_path: Path) -> None:
    out = _python("""
        import sys
        import runstream
        from runstream import Client, Flow, Worker, RunStatus, idempotency_key, Cancelled
        from runstream.testing import TestEnvironment
        import runstream.engine.cli, runstream.engine.ui.app, runstream.engine.demo.driver
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("engine", "projections")))
    """, tmp_path)
    assert out.strip() == "[]"


def test_python_m_runstream_is_the_command_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "runstream", "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "Usage:" in done.stdout and "worker" in done.stdout
