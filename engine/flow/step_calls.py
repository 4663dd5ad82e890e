"""What a step call is made of: the digest of its arguments (journaled, for dry runs) and the
call as its attempts need it (engine.flow.context)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, NamedTuple

from pydantic import TypeAdapter, ValidationError

from runstream.engine.errors import StepFailed
from runstream.engine.flow.definition import RetryPolicy, one_line

RESULT_INVALID = "ResultInvalid"  # the error type of a journaled result the step's type refuses


def args_digest(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The digest a step journals of its arguments (first 16 hex digits of the sha256 of
    their canonical JSON), so that a dry run can tell when new code calls a step with other
    arguments. Values JSON cannot hold are taken by their repr: stable for plain values and
    dataclasses, not for objects whose repr shows an address."""
    if not args and not kwargs:
        return _NO_ARGUMENTS_DIGEST
    try:
        text = _CANONICAL.encode([args, kwargs])
    except (TypeError, ValueError):  # keys JSON cannot sort or hold, a reference cycle
        text = repr((args, sorted(kwargs.items())))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


# Built once: json.dumps with options builds an encoder per call, which costs more than the
# hashing (a step's digest is about 3 µs this way).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=repr)
_NO_ARGUMENTS_DIGEST = hashlib.sha256(b"[[],{}]").hexdigest()[:16]


class StepCall(NamedTuple):
    """A step's call as its attempts need it."""

    position: int
    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    adapter: TypeAdapter[Any]
    policy: RetryPolicy
    limit: float | None
    digest: str
    irreversible: bool


def replayed_result(adapter: TypeAdapter[Any], name: str, result_json: str | None,
                    attempts: int) -> Any:
    """A completed step's journaled result, as the step's return type reads it. One it does
    not read (an operator's skip result of another type, code changed under the run, or a
    function that returned another type: the first run reads it so too) fails the step in
    one line; it failed the run with pydantic's several."""
    try:
        return adapter.validate_json(result_json or "null")
    except ValidationError as exc:
        why = one_line(exc, "the result")
        raise StepFailed(name, RESULT_INVALID,
                         f"its journaled result {_shown(result_json)} does not fit the step's "
                         f"return type: {why}", attempts) from None


def _shown(result_json: str | None) -> str:
    text = result_json or "null"
    return text if len(text) <= 80 else f"{text[:77]}..."
