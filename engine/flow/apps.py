"""Loading a user's flows from an `--app package.module:attr` reference (CLI, UI, dry run)."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from runstream.engine.errors import RunstreamError
from runstream.engine.flow.definition import Flow


class AppNotFound(RunstreamError):
    pass


def load_flows(app: str) -> list[Flow[Any, Any]]:
    """`package.module:attr` -> the flows it names (a list of Flow, or a callable returning one)."""
    module_name, _, attr = app.partition(":")
    if not module_name or not attr:
        raise AppNotFound(f"--app {app!r} must look like package.module:flows_list")
    _importable_here()
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise AppNotFound(f"cannot import {module_name!r} for --app: {exc}") from None
    value = getattr(module, attr, None)
    if value is None:
        raise AppNotFound(f"module {module_name!r} has no attribute {attr!r}")
    flows = value() if callable(value) and not isinstance(value, Flow) else value
    flows = [flows] if isinstance(flows, Flow) else list(flows)
    if not flows or not all(isinstance(f, Flow) for f in flows):
        raise AppNotFound(f"{app} must be a Flow or a list of Flow objects")
    return flows


def _importable_here() -> None:
    """Make the current directory importable, as `python -m` does and as uvicorn's and
    celery's `--app` do: `runstream worker --app myapp:flows` run from the application's
    directory finds `myapp` without PYTHONPATH. (runstream itself never imports a top-level
    name a user's directory could hold: its own modules are all under `runstream.`.)"""
    here = os.getcwd()
    if "" not in sys.path and here not in sys.path:
        sys.path.insert(0, here)
