"""Fixtures shared by every test: a real Kafka broker, a fresh namespace, its journal topic.

The broker, in order of preference:
1. `RUNSTREAM_BOOTSTRAP`, if set (it must answer);
2. Redpanda in a container (testcontainers), if a Docker engine answers;
3. the local launcher (`runstream broker start`): a broker already answering at
   127.0.0.1:9092 is reused, otherwise one is started for the session and stopped after it.

Under CI=true a missing broker fails the tests that need one; elsewhere they are skipped
with the reason. Tests under tests/integration, and any test using `bootstrap`, are marked
`integration`.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from runstream.engine.broker import BrokerCluster, BrokerError, is_answering
from runstream.engine.config import DEFAULT_BOOTSTRAP
from runstream.engine.kafka.admin import delete_topics, ensure_topics
from tests.file_times import pytest_runtest_logreport, pytest_terminal_summary
from tests.hang_dump import pytest_runtest_call

# Same image as docker-compose.yml.
REDPANDA_IMAGE = "docker.redpanda.com/redpandadata/redpanda:v24.2.7"
TEST_JOURNAL_PARTITIONS = 4
# Every decision a worker of the suite (in process or not) takes back without decoding it
# is decoded as well and compared (engine.worker.sent): a difference stops that worker.
os.environ.setdefault("RUNSTREAM_CHECK_OWN_RECORDS", "1")
# Every record a client's tail folds is folded through the reducer as well, decoded in
# full (engine.client.tail): a difference fails every wait of that client.
os.environ.setdefault("RUNSTREAM_CHECK_TAIL", "1")
_INTEGRATION_DIR = Path(__file__).parent / "integration"
_UNIT_DIR = (Path(__file__).parent / "unit").resolve()
_STARTED = pytest.StashKey[BrokerCluster]()  # the broker the xdist controller started
# Hooks from tests/file_times.py and tests/hang_dump.py, re-exported so pytest finds them.
__all__ = ["pytest_runtest_call", "pytest_runtest_logreport", "pytest_terminal_summary"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        in_dir = _INTEGRATION_DIR in item.path.parents
        if in_dir or "bootstrap" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.integration)


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def _no_broker(reason: str) -> NoReturn:
    # In CI a test that silently skips proves nothing: a missing broker is a failure there.
    if in_ci():
        pytest.fail(f"no Kafka broker (CI=true): {reason}", pytrace=False)
    pytest.skip(f"no Kafka broker: {reason}")


def _docker_answers() -> bool:
    try:
        import docker
        from docker.errors import DockerException
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=3)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (DockerException, OSError):
        return False


def _redpanda() -> Iterator[str]:
    from testcontainers.community.kafka import RedpandaContainer

    container = RedpandaContainer(image=REDPANDA_IMAGE)
    try:
        container.start(timeout=120)
    except Exception as exc:  # the container runtime's errors are many and untyped
        with contextlib.suppress(Exception):
            container.stop()
        _no_broker(f"Redpanda container did not start: {exc}")
    try:
        yield str(container.get_bootstrap_server())
    finally:
        container.stop()


def _shared_broker_needed(config: pytest.Config) -> bool:
    """pytest-xdist's controller about to start its processes, with no broker to share: each
    would start its own local broker on one port (they collided), and the first to finish
    would stop it under the others."""
    return (not hasattr(config, "workerinput") and bool(config.getoption("numprocesses", None))
            and not _unit_tests_only(config.args)
            and not os.environ.get("RUNSTREAM_BOOTSTRAP") and not _docker_answers()
            and not is_answering(DEFAULT_BOOTSTRAP))


def _unit_tests_only(args: list[str]) -> bool:
    """Every path pytest was given lies in tests/unit (`-n 2 tests/unit`: no broker needed,
    none started; a unit test that asks for one still starts its own)."""
    paths = [Path(arg.split("::")[0]).resolve() for arg in args]
    return bool(paths) and all(p.is_relative_to(_UNIT_DIR) for p in paths)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Under `pytest -n N`, the controller starts the local broker once, before its
    processes, which find it answering; it stops it after them (pytest_sessionfinish)."""
    if not _shared_broker_needed(session.config):
        return
    cluster = BrokerCluster()
    try:
        cluster.start()
    except BrokerError as exc:  # (each process then says so, or fails under CI=true)
        print(f"the local broker did not start: {exc}")
        return
    session.config.stash[_STARTED] = cluster


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    cluster = session.config.stash.get(_STARTED, None)
    if cluster is not None:
        cluster.stop()


def _local_broker() -> Iterator[str]:
    if is_answering(DEFAULT_BOOTSTRAP):
        yield DEFAULT_BOOTSTRAP
        return
    cluster = BrokerCluster()
    try:
        cluster.start()
    except BrokerError as exc:
        _no_broker(f"the local broker did not start: {exc}")
    try:
        yield cluster.bootstrap
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def bootstrap() -> Iterator[str]:
    """The address of a real Kafka-compatible broker for the whole session."""
    explicit = os.environ.get("RUNSTREAM_BOOTSTRAP")
    if explicit:
        if not is_answering(explicit, timeout=5.0):
            _no_broker(f"RUNSTREAM_BOOTSTRAP={explicit} does not answer")
        yield explicit
    elif _docker_answers():
        yield from _redpanda()
    else:
        yield from _local_broker()


@pytest.fixture(scope="session", autouse=True)
def read_model_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Clients and the CLI keep their read models here, not in the user's cache."""
    path = tmp_path_factory.mktemp("readmodels")
    old = os.environ.get("RUNSTREAM_CACHE_DIR")
    os.environ["RUNSTREAM_CACHE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("RUNSTREAM_CACHE_DIR", None)
    else:
        os.environ["RUNSTREAM_CACHE_DIR"] = old


@pytest.fixture
def namespace() -> str:
    """A namespace no other test uses, so tests share the broker without sharing topics."""
    return f"t-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def one_partition(bootstrap: str, namespace: str) -> AsyncIterator[str]:
    """The namespace's topics with a journal of one partition (every run in it); yield the
    journal's name. Deleted afterwards, as `journal`'s."""
    report = await ensure_topics(bootstrap, namespace, partitions=1)
    assert report.ok, report.mismatches()
    yield report.journal.name
    if os.environ.get("RUNSTREAM_KEEP_TOPICS") != "1":
        await delete_topics(bootstrap, namespace)


@pytest.fixture
async def journal(bootstrap: str, namespace: str) -> AsyncIterator[str]:
    """Create the namespace's topics (journal with 4 partitions); yield the journal's name.

    The topics are deleted afterwards so a long-lived development broker does not collect
    thousands of them; set RUNSTREAM_KEEP_TOPICS=1 to keep them for inspection.
    """
    report = await ensure_topics(bootstrap, namespace, partitions=TEST_JOURNAL_PARTITIONS)
    assert report.ok, report.mismatches()
    yield report.journal.name
    if os.environ.get("RUNSTREAM_KEEP_TOPICS") != "1":
        await delete_topics(bootstrap, namespace)
