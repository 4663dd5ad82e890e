"""Fixtures of the UI tests: a namespace with runs made by a real worker on the real broker,
the UI served in-process on a free port, and headless Chromium driven by Playwright.

Chromium is Debian's (`apt-get install chromium`, which scripts/bootstrap.sh does);
Playwright only drives it (`executable_path`), it downloads no browser. Under CI=true a
missing Chromium or Playwright fails the tests; elsewhere they are skipped with the reason.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest
from aiohttp import web
from aiokafka import AIOKafkaProducer

from runstream import Client, RunFailed, RunStatus, Worker
from runstream.engine.config import journal_topic
from runstream.engine.journal import encode
from runstream.engine.journal import events as ev
from runstream.engine.kafka.admin import delete_topics, ensure_topics
from runstream.engine.readmodel.model import ReadModel
from runstream.engine.readmodel.view import View
from runstream.engine.ui import UiSettings, create_app
from runstream.projections.partitioning import partition_for
from tests.builders import Writer
from tests.conftest import in_ci
from tests.integration.support import status_or_none
from tests.ui.flows import batch, broken, flaky, flows, nap, order

CHROMIUM = os.environ.get("RUNSTREAM_CHROMIUM", "/usr/bin/chromium")
# As the machine notes say: no sandbox as root, and no background connections to a network
# that refuses them.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
PARTITIONS = 4


def _no_browser(reason: str) -> NoReturn:
    if in_ci():  # a UI test that skips in CI proves nothing
        pytest.fail(f"no headless Chromium (CI=true): {reason}", pytrace=False)
    pytest.skip(f"no headless Chromium: {reason}")


@pytest.fixture(scope="session")
def chromium() -> str:
    """The Chromium binary, once Playwright is known to be importable."""
    if not Path(CHROMIUM).exists():
        _no_browser(f"{CHROMIUM} is missing (apt-get install chromium, or bash "
                    f"scripts/bootstrap.sh)")
    try:
        import playwright.async_api  # noqa: F401
    except ImportError as exc:
        _no_browser(f"Playwright is not installed ({exc}): pip install -e '.[test]'")
    return CHROMIUM


@pytest.fixture(scope="session")
async def browser(chromium: str) -> AsyncIterator[Any]:
    """Debian's Chromium, headless, launched once for the session."""
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=chromium,
                                                    args=CHROMIUM_ARGS, headless=True)
        yield launched
        await launched.close()


@dataclass
class Tab:
    """A browser page and every console error, page error and failed request it had."""

    page: Any
    errors: list[str] = field(default_factory=list)

    def assert_clean(self) -> None:
        assert self.errors == [], "\n".join(self.errors)


@pytest.fixture
async def tab(browser: Any) -> AsyncIterator[Tab]:
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    found = Tab(page)

    def on_console(message: Any) -> None:
        if message.type == "error":
            found.errors.append(f"console error: {message.text} ({message.location})")

    page.on("console", on_console)
    page.on("pageerror", lambda error: found.errors.append(f"page error: {error}"))
    page.on("requestfailed", lambda request: found.errors.append(
        f"request failed: {request.url} ({request.failure})"))
    page.set_default_timeout(15_000)
    yield found
    await context.close()


@dataclass
class Scene:
    """The namespace the UI shows: its runs, and the instant between its two batches."""

    bootstrap: str
    namespace: str
    base_url: str
    root: Path  # a directory for the module's read models
    reference: ReadModel  # a read model of its own, in another directory than the UI's
    boundary_ms: int  # the nap and broken runs settled before it; the rest came after
    order_id: str = "order-1042"
    waiting_order_id: str = "order-1043"
    batch_id: str = "batch-7"
    nap_id: str = "nap-1"
    broken_id: str = "broken-1"
    flaky_id: str = "flaky-1"

    async def view(self) -> View:
        return await self.reference.catch_up()


async def _until(client: Client, run_id: str, status: RunStatus, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while await status_or_none(client, run_id) is not status:
        assert time.monotonic() < deadline, f"{run_id} never became {status}"
        await asyncio.sleep(0.1)


async def _send_zombie_step(bootstrap: str, namespace: str, run_id: str) -> None:
    """A step completion written by a writer that does not own the run's partition: the
    reducer fences it, and history keeps it with that verdict."""
    ghost = Writer("zombie-worker")
    record = ghost.decide(ev.StepCompleted, run_id=run_id, position=1, name="charge",
                          result_json='"stale"', attempt=1)
    value, headers = encode(record)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        await producer.send_and_wait(journal_topic(namespace), value=value,
                                     key=run_id.encode(), headers=headers,
                                     partition=partition_for(run_id, PARTITIONS))
    finally:
        await producer.stop()


async def _make_runs(bootstrap: str, namespace: str, data_dir: Path) -> int:
    """Runs of every kind, in two batches around an instant; returns that instant."""
    worker = Worker(flows=flows, data_dir=data_dir, bootstrap_servers=bootstrap,
                    namespace=namespace, session_timeout_ms=6000)
    await worker.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=flows) as client:
            await client.create_run(nap, None, run_id="nap-1")
            # (a yearly schedule: it fires no run while the tests look at the runs)
            await client.create_schedule("new-year", nap, None, cron="0 3 1 1 *",
                                         timezone="Europe/Berlin")
            failing = await client.create_run(broken, None, run_id="broken-1")
            with pytest.raises(RunFailed):
                await failing.result(timeout=30)
            await _until(client, "nap-1", RunStatus.suspended)
            # The instant between the batches, on a whole second (what a datetime input with
            # step=1 can name), at least a second after the first batch settled.
            boundary_ms = math.ceil(time.time() + 1.0) * 1000
            await asyncio.sleep(boundary_ms / 1000 - time.time() + 0.3)
            await _second_batch(client, bootstrap, namespace)
            return boundary_ms
    finally:
        await worker.stop()


async def _second_batch(client: Client, bootstrap: str, namespace: str) -> None:
    shipped = await client.create_run(order, {"sku": "tea-42", "qty": 3}, run_id="order-1042")
    await client.create_run(order, {"sku": "mug-7", "qty": 1}, run_id="order-1043")
    fan_out = await client.create_run(batch, {"items": 2, "rounds": 2, "round": 0},
                                      run_id="batch-7")
    await _until(client, "order-1042", RunStatus.suspended)
    await _send_zombie_step(bootstrap, namespace, "order-1042")
    await client.signal("order-1042", "approval", "ops", request_id="approve-1042")
    await client.signal("order-1042", "approval", "ops", request_id="approve-1042")  # again
    await shipped.result(timeout=30)
    await fan_out.result(timeout=60, follow=True)
    await _until(client, "order-1043", RunStatus.suspended)
    await client.create_run(flaky, None, run_id="flaky-1")
    await _until(client, "flaky-1", RunStatus.suspended)  # its first attempt failed


async def serve(settings: UiSettings) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(create_app(settings), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
async def scene(bootstrap: str, tmp_path_factory: pytest.TempPathFactory
                ) -> AsyncIterator[Scene]:
    """One namespace for the module's tests (making its runs takes ~10 s), served by the UI."""
    namespace = f"ui-{uuid.uuid4().hex[:8]}"
    root = tmp_path_factory.mktemp("ui")
    report = await ensure_topics(bootstrap, namespace, partitions=PARTITIONS)
    assert report.ok, report.mismatches()
    try:
        boundary_ms = await _make_runs(bootstrap, namespace, root / "worker")
        runner, base_url = await serve(UiSettings(bootstrap=bootstrap, namespace=namespace,
                                                   read_model_dir=root / "ui-readmodel"))
        reference = ReadModel(bootstrap=bootstrap, topic=journal_topic(namespace),
                              path=root / "reference")
        try:
            yield Scene(bootstrap, namespace, base_url, root, reference, boundary_ms)
        finally:
            await reference.close()
            await runner.cleanup()
    finally:
        if os.environ.get("RUNSTREAM_KEEP_TOPICS") != "1":
            await delete_topics(bootstrap, namespace)
