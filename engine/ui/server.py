"""`runstream ui`: serve the UI until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import errno
import signal
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from runstream.engine.config import resolve_bootstrap, resolve_namespace
from runstream.engine.errors import RunstreamError
from runstream.engine.ui.app import UiSettings, create_app


class PortInUse(RunstreamError):
    pass


async def serve_ui(*, bootstrap: str | None, namespace: str | None, host: str, port: int,
                   app: str | None = None, read_model_dir: Path | None = None,
                   on_ready: Callable[[str], None] | None = None) -> None:
    """Serve the UI on host:port until SIGINT or SIGTERM; `on_ready` hears its address."""
    settings = UiSettings(bootstrap=resolve_bootstrap(bootstrap),
                          namespace=resolve_namespace(namespace),
                          read_model_dir=read_model_dir, app=app)
    runner = web.AppRunner(create_app(settings), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            # (a host that does not resolve, or is not this machine's, was told to pick
            # another port)
            which = ("pick another --port" if exc.errno == errno.EADDRINUSE else
                     "check --host: an address of this machine, e.g. 127.0.0.1 or 0.0.0.0")
            raise PortInUse(f"cannot listen on {host}:{port} ({exc.strerror or exc}); "
                            f"{which}") from None
        if on_ready is not None:
            bound = runner.addresses[0][1] if runner.addresses else port  # port 0: chosen
            on_ready(f"http://{host}:{bound}/")
        await _until_stopped()
    finally:
        await runner.cleanup()


async def _until_stopped() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
