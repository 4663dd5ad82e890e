"""Loading a user's flows from an `--app package.module:attr` reference (CLI, UI, dry run)."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import traceback
from collections.abc import Iterable, Mapping
from typing import Any

from runstream.engine.errors import InvalidInput
from runstream.engine.flow.definition import Flow

_SHAPE = "must be a Flow, a list of Flow objects, or a function of no arguments returning one"


class AppNotFound(InvalidInput):
    """An `--app` that names no flows: one line saying why."""


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
    except Exception as exc:  # (a syntax error, or the module's own code failing: one line)
        raise AppNotFound(f"cannot import {module_name!r} for --app: {_where(exc)}") from None
    value = getattr(module, attr, None)
    if value is None:
        raise AppNotFound(f"module {module_name!r} has no attribute {attr!r}")
    flows = _called(app, value) if callable(value) and not isinstance(value, Flow) else value
    if isinstance(flows, Flow):
        return [flows]
    if not isinstance(flows, Iterable) or isinstance(flows, (str, bytes, Mapping)):
        raise AppNotFound(f"{app} {_SHAPE}, not {type(flows).__name__}")
    found = list(flows)
    if not found or not all(isinstance(f, Flow) for f in found):
        raise AppNotFound(f"{app} {_SHAPE}")
    return found


def _where(exc: Exception) -> str:
    """The error, and where in the user's code it was raised (a syntax error says where)."""
    text = f"{type(exc).__name__}: {exc}"
    libraries = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix})  # (json's own, say)
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith(libraries) and not f.filename.startswith("<")]
    if isinstance(exc, SyntaxError) or not frames:
        return text
    return f"{text} (at {frames[-1].filename}, line {frames[-1].lineno})"


def _called(app: str, factory: Any) -> Any:
    """What a factory of flows returns; one that needs arguments (json:dumps) is no
    factory. (A factory that fails raises its own error, with its traceback.)"""
    try:
        inspect.signature(factory).bind()
    except TypeError:
        raise AppNotFound(f"{app} {_SHAPE}: it takes arguments") from None
    except ValueError:
        pass  # no signature to read (some builtins): calling it is the test
    return factory()


def _importable_here() -> None:
    """Make the current directory importable, as `python -m` does and as uvicorn's and
    celery's `--app` do: `runstream worker --app myapp:flows` run from the application's
    directory finds `myapp` without PYTHONPATH. (runstream itself never imports a top-level
    name a user's directory could hold: its own modules are all under `runstream.`.)"""
    here = os.getcwd()
    if "" not in sys.path and here not in sys.path:
        sys.path.insert(0, here)


def flows_by_name(flows: Iterable[Flow[Any, Any]]) -> dict[str, Flow[Any, Any]]:
    """The flows a worker runs, by name; InvalidInput when two differ under one name (the
    last one silently won: runs of the first went to the second's handler)."""
    named: dict[str, Flow[Any, Any]] = {}
    for flow in flows:
        if named.get(flow.name, flow) is not flow:
            raise InvalidInput(f"two different flows are named {flow.name!r}: a worker runs "
                               f"one flow per name (give one of them another name)")
        named[flow.name] = flow
    return named
