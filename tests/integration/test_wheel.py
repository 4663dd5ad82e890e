"""The installed distribution, as a user gets it: a wheel built from this checkout, installed
with its dependencies into a fresh venv, run from an application directory that holds its
own `engine.py` and `projections/` package (names runstream had before 0.2).

One venv serves the whole module (building and installing costs ~20 s with pip's cache).
Nothing here skips: a wheel that does not build or install fails the test, in CI as anywhere.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT = 300

# The application's own modules named like runstream's old top-level packages. Each defines
# names of its own; an import by runstream would find them and fail, and an import of
# runstream's under these names would hide them from the application.
APP_ENGINE = '''\
"""The application's own engine: nothing to do with runstream."""
APP_ENGINE = True
Client = "the application's Client"
def render(name):
    return f"hello {name}"
'''
APP_PROJECTIONS = '''\
"""The application's own read-side projections."""
APP_PROJECTIONS = True
state = "the application's state"
STORE = "app-store"
'''
APP_FLOWS = '''\
import engine as app_engine             # the application's own engine.py
import projections as app_projections   # and its own projections/
from runstream import Flow, FlowContext

greet = Flow("greet")

@greet.handler
async def run_greet(ctx: FlowContext, p: dict) -> dict:
    text = await ctx.step("say", app_engine.render, p["name"])
    return {"text": text, "store": app_projections.STORE}

flows = [greet]
'''
RAISES = '''\
import sys
print("runstream imported the application's own module", __name__, file=sys.stderr)
raise RuntimeError(f"the application's {__name__} was imported by runstream")
'''
LEGACY_FLOWS = '''\
from engine import Flow, FlowContext     # the deprecated name, as written before 0.2

legacy = Flow("legacy")

@legacy.handler
async def run_legacy(ctx: FlowContext, p: dict) -> dict:
    doubled = await ctx.step("double", lambda n: n * 2, p["n"])
    return {"doubled": doubled}

flows = [legacy]
'''


@dataclass(frozen=True)
class Installed:
    venv: Path
    wheel: Path
    app_dir: Path     # holds the application's own engine.py and projections/
    hostile_dir: Path  # its engine.py and projections/ raise when imported at all
    legacy_dir: Path  # no engine.py: `from engine import ...` means runstream's old name

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def script(self) -> Path:
        return self.venv / "bin" / "runstream"


def _run(args: list[str | Path], *, cwd: Path, timeout: float = 120,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert done.returncode == 0, f"{args}\nstdout: {done.stdout[-3000:]}\n" \
                                 f"stderr: {done.stderr[-3000:]}"
    return done


def _clean_env(**extra: str) -> dict[str, str]:
    """The environment without this checkout's venv, so only the fresh venv's runstream is
    found (and no PYTHONPATH pointing back here)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    return {**env, **extra}


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    base = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", base / "dist", ROOT],
         cwd=base, timeout=INSTALL_TIMEOUT)
    (wheel,) = (base / "dist").glob("runstream-*.whl")
    _run([sys.executable, "-m", "venv", base / "venv"], cwd=base)
    _run([base / "venv" / "bin" / "python", "-m", "pip", "install", "-q",
          "--disable-pip-version-check", wheel], cwd=base, timeout=INSTALL_TIMEOUT,
         env=_clean_env())
    app_dir, hostile_dir, legacy_dir = base / "app", base / "hostile", base / "legacy"
    (hostile_dir / "projections").mkdir(parents=True)
    (hostile_dir / "engine.py").write_text(RAISES)
    (hostile_dir / "projections" / "__init__.py").write_text(RAISES)
    (app_dir / "projections").mkdir(parents=True)
    (app_dir / "engine.py").write_text(APP_ENGINE)
    (app_dir / "projections" / "__init__.py").write_text(APP_PROJECTIONS)
    (app_dir / "myapp.py").write_text(APP_FLOWS)
    legacy_dir.mkdir()
    (legacy_dir / "oldapp.py").write_text(LEGACY_FLOWS)
    yield Installed(base / "venv", wheel, app_dir, hostile_dir, legacy_dir)


def _python(installed: Installed, cwd: Path, code: str) -> str:
    return _run([installed.python, "-c", textwrap.dedent(code)], cwd=cwd,
                env=_clean_env()).stdout


def test_the_wheel_holds_runstream_and_only_alias_shims_at_top_level(
        installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    for needed in ("runstream/__init__.py", "runstream/testing.py", "runstream/_legacy.py",
                   "runstream/engine/__init__.py", "runstream/engine/worker/__init__.py",
                   "runstream/engine/kafka/reader.py", "runstream/engine/ui/static/ui.js",
                   "runstream/engine/_schemas/registry.json",
                   "runstream/projections/__init__.py", "runstream/projections/reducer.py"):
        assert needed in names, needed
    top_level = {n for n in names if not n.startswith(("runstream/", "runstream-"))}
    assert top_level == {"engine/__init__.py", "projections/__init__.py"}
    for shim in top_level:  # a shim only makes its name an alias: no code of its own
        assert "_legacy import adopt" in zipfile.ZipFile(installed.wheel).read(shim).decode()


def test_runstream_imports_beside_the_applications_own_engine_and_projections(
        installed: Installed) -> None:
    out = _python(installed, installed.app_dir, """
        import sys
        import runstream
        from runstream import Client, Flow, Worker
        from runstream.testing import TestEnvironment
        import runstream.engine.cli, runstream.engine.ui.app, runstream.projections.state
        assert "engine" not in sys.modules and "projections" not in sys.modules, "runstream \
imported an old top-level name"
        assert runstream.__file__.startswith(sys.prefix), runstream.__file__
        import engine, projections
        assert engine.APP_ENGINE and projections.APP_PROJECTIONS
        assert engine.Client == "the application's Client"
        print(Client.__module__, Worker.__module__, Flow.__module__)
    """)
    assert out.split() == ["runstream.engine.client.client", "runstream.engine.worker.worker",
                           "runstream.engine.flow.definition"]


def test_a_flow_runs_in_the_test_environment_from_the_app_directory(
        installed: Installed) -> None:
    out = _python(installed, installed.app_dir, """
        import asyncio, json
        from runstream.testing import TestEnvironment
        from myapp import flows

        async def main():
            env = TestEnvironment(flows)
            try:
                print(json.dumps(await env.run("greet", {"name": "ada"}, run_id="g1")))
            finally:
                await env.close()
        asyncio.run(main())
    """)
    assert json.loads(out) == {"text": "hello ada", "store": "app-store"}


def test_nothing_imports_an_engine_or_projections_that_raises(installed: Installed) -> None:
    out = _python(installed, installed.hostile_dir, """
        import asyncio
        import runstream
        from runstream import Client, Flow, FlowContext, Worker
        from runstream.testing import TestEnvironment
        import runstream.engine.cli, runstream.engine.ui.app, runstream.engine.demo.driver
        echo = Flow("echo")

        @echo.handler
        async def run_echo(ctx: FlowContext, p: dict) -> dict:
            return {"echo": await ctx.step("copy", dict, p)}

        async def main():
            async with TestEnvironment([echo]) as env:
                print(await env.run(echo, {"a": 1}))
        asyncio.run(main())
    """)
    assert out.strip() == "{'echo': {'a': 1}}"


def test_the_installed_script_and_python_m_runstream_answer_help(installed: Installed) -> None:
    for command in ([installed.script, "--help"], [installed.python, "-m", "runstream", "--help"]):
        done = _run(command, cwd=installed.hostile_dir, env=_clean_env(PYTHONPATH="."))
        assert "worker" in done.stdout and "Usage:" in done.stdout, done.stdout
        assert "Traceback" not in done.stderr and "imported" not in done.stderr, done.stderr


def test_the_old_names_are_aliases_with_one_deprecation_warning(installed: Installed) -> None:
    out = _python(installed, installed.legacy_dir, """
        import json, warnings
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from engine import Client, Flow
            import projections.state
            import engine.worker
            import engine.kafka.reader
        import runstream, runstream.projections.state, runstream.engine.kafka.reader
        ours = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)
                and "runstream" in str(w.message)]
        print(json.dumps({
            "warnings": ours,
            "client": Client is runstream.Client, "flow": Flow is runstream.Flow,
            "worker": engine.worker.Worker is runstream.Worker,
            "state": projections.state is runstream.projections.state,
            "reader": engine.kafka.reader is runstream.engine.kafka.reader,
            "spec": runstream.engine.kafka.reader.__spec__.name,
        }))
    """)
    found = json.loads(out)
    assert len(found.pop("warnings")) == 1, out
    assert found == {"client": True, "flow": True, "worker": True, "state": True,
                     "reader": True, "spec": "runstream.engine.kafka.reader"}


async def test_a_worker_of_the_installed_script_runs_app_and_legacy_flows(
        installed: Installed, bootstrap: str, namespace: str, journal: str) -> None:
    scratch = installed.venv.parent / namespace
    env = _clean_env(RUNSTREAM_BOOTSTRAP=bootstrap, RUNSTREAM_NAMESPACE=namespace,
                     RUNSTREAM_CACHE_DIR=str(scratch / "cache"))
    # No PYTHONPATH: `--app myapp:flows` is found in the directory the worker starts in.
    # One worker at a time: a worker owns partitions for every flow of the namespace, so two
    # with different apps would leave each other's runs pending.
    greeted, log = _run_one(installed, env, scratch, installed.app_dir, "myapp:flows",
                            "greet", {"name": "kafka"})
    assert greeted["result"] == {"text": "hello kafka", "store": "app-store"}, (greeted, log)
    doubled, log = _run_one(installed, env, scratch, installed.legacy_dir, "oldapp:flows",
                            "legacy", {"n": 21})
    assert doubled["result"] == {"doubled": 42}, (doubled, log)


def _run_one(installed: Installed, env: dict[str, str], scratch: Path, app_dir: Path, app: str,
             flow: str, payload: object) -> tuple[dict[str, object], str]:
    """Start `runstream worker --app APP` in `app_dir`, create one run of `flow` by name with
    `runstream run create FLOW --wait`, stop the worker: the run's JSON answer and the log."""
    scratch.mkdir(parents=True, exist_ok=True)
    log_path = scratch / f"{flow}.log"
    with log_path.open("w") as log:
        worker = subprocess.Popen(
            [str(installed.script), "worker", "--app", app, "--data-dir",
             str(scratch / f"data-{flow}")],
            cwd=app_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            answer = _created(installed, env, flow, payload, f"run-{flow}")
        finally:
            code = _stop(worker)
    text = log_path.read_text()
    assert code == 0 and "Traceback" not in text, text
    return answer, text


def _created(installed: Installed, env: dict[str, str], flow: str, payload: object,
             run_id: str) -> dict[str, object]:
    """`runstream run create FLOW --wait` by flow name; its JSON answer."""
    done = _run([installed.script, "run", "create", flow, "--payload", json.dumps(payload),
                 "--id", run_id, "--wait", "--timeout", "90"],
                cwd=installed.app_dir, env=env, timeout=150)
    answer = json.loads(done.stdout)
    assert isinstance(answer, dict), done.stdout
    return answer


def _stop(worker: subprocess.Popen[bytes]) -> int:
    """SIGTERM, as a service manager stops a worker; its exit code."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
    try:
        return worker.wait(timeout=40)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait(timeout=10)
        raise
