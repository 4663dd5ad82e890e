"""A step's result type: a pydantic adapter from its function's return annotation, so a
step returns the same type on its first run and on replay (engine.flow.context)."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Hashable
from typing import Any

from pydantic import TypeAdapter

RESULT_NOT_JSON = "ResultNotJson"  # a step failed for good: its result has no JSON form

# One adapter per result type: bounded by the distinct return annotations of the flows'
# step functions (code, not data).
_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}
_ANY_ADAPTER: TypeAdapter[Any] = TypeAdapter(Any)


def result_adapter(fn: Callable[..., Any]) -> TypeAdapter[Any]:
    """The step result's type from fn's return annotation, so replays return that type."""
    inner = fn if getattr(fn, "__wrapped__", None) is None else inspect.unwrap(fn)
    code = getattr(inner, "__code__", None)
    returns = getattr(fn, "__annotations__", {}).get("return")
    if code is None or not isinstance(returns, Hashable):
        return _adapter_for(fn)
    # Keyed by the function's code, globals and return annotation: resolving string
    # annotations costs more than a step's own bookkeeping. A lambda made per call shares
    # its code object; functions behind one decorator (functools.wraps) share the wrapper's,
    # and closures of one factory their code with other annotations.
    key = (code, id(getattr(inner, "__globals__", None)), returns)
    adapter = _BY_CODE.get(key)
    if adapter is None:
        if len(_BY_CODE) >= MAX_CACHED_FUNCTIONS:
            _BY_CODE.clear()
        adapter = _BY_CODE[key] = _adapter_for(fn)
    return adapter


MAX_CACHED_FUNCTIONS = 4096
_BY_CODE: dict[tuple[object, int, Hashable], TypeAdapter[Any]] = {}  # MAX_CACHED_FUNCTIONS at most


def _adapter_for(fn: Callable[..., Any]) -> TypeAdapter[Any]:
    try:
        hint = typing.get_type_hints(fn).get("return", Any)
    except Exception:
        return _ANY_ADAPTER
    if hint is None or hint is type(None):
        hint = Any
    adapter = _ADAPTERS.get(hint)
    if adapter is None:
        try:
            adapter = TypeAdapter(hint)
        except Exception:
            adapter = _ANY_ADAPTER
        _ADAPTERS[hint] = adapter
    return adapter
