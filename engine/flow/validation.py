"""Running an update's validator (Flow.validator) as its owner does: in a thread of its own,
with a time limit, its verdict a reason to reject or None. The TestEnvironment waits for that
thread (`judge`); the worker awaits it on its event loop (`judge_on_loop`, from
engine.worker.reactions), so that no thread of the loop's pool stands waiting on a slow
validator: that pool also runs sync steps and snapshot reads, and six slow validators held
all of it here (two cores: min(32, cores + 4) threads). Same preparation, same verdicts.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from runstream.engine.errors import ThreadsExhausted, journal_text
from runstream.engine.flow.bounded import in_own_thread, start_own_thread
from runstream.engine.flow.definition import one_line
from runstream.projections.reactions import RegisteredFlow
from runstream.projections.state import InboxItem

VALIDATOR_LIMIT_S = 5.0  # a validator still running after this rejects its update

Verdict = str | None  # None: accepted; else why it is rejected
Validation = Callable[[], Verdict]


def judge(flow: RegisteredFlow, item: InboxItem, limit: float = VALIDATOR_LIMIT_S
          ) -> Verdict:
    """None: the update is accepted; else why it is rejected (the validator's message, or
    that it ran out of time; a validator that never returns is abandoned in its thread)."""
    prepared = _prepared(flow, item)
    if not callable(prepared):
        return prepared
    verdict: list[Verdict] = []
    try:  # (counted as the worker's are: the same verdicts)
        thread = start_own_thread(f"runstream-validator-{item.name}",
                                  lambda: verdict.append(prepared()))
    except ThreadsExhausted as exc:
        return str(exc)
    thread.join(limit)
    return verdict[0] if verdict else _out_of_time(item, limit)


async def judge_on_loop(flow: RegisteredFlow, item: InboxItem,
                        limit: float = VALIDATOR_LIMIT_S) -> Verdict:
    """`judge`, awaited: the validator's thread hands its verdict to the loop."""
    prepared = _prepared(flow, item)
    if not callable(prepared):
        return prepared
    try:
        verdict: Verdict = await asyncio.wait_for(in_own_thread(
            f"runstream-validator-{item.name}", prepared, (), {}), limit)
    except TimeoutError:
        return _out_of_time(item, limit)
    except ThreadsExhausted as exc:
        return str(exc)
    return verdict


def _prepared(flow: RegisteredFlow, item: InboxItem) -> Verdict | Validation:
    """The validation to run, or the verdict without one (no validator: accepted; a payload
    that is not JSON: rejected)."""
    validator: Any = flow.validator_for(item.name or "")
    if validator is None:
        return None
    try:
        payload = json.loads(item.payload_json or "null")
    except ValueError as exc:
        return f"the payload is not JSON: {exc}"

    def validation() -> Verdict:
        try:
            returned = validator(payload)
        except Exception as exc:  # its refusal, whatever it raised
            return journal_text(_reason(exc))
        if inspect.isawaitable(returned):  # (never awaited, it accepted every update)
            with contextlib.suppress(Exception):
                returned.close()  # type: ignore[attr-defined]
            return (f"the validator of update {item.name!r} is async; a validator is a plain "
                    f"function (it runs off the event loop)")
        return None

    return validation


def _reason(exc: Exception) -> str:
    """Its refusal in one line: a pydantic error's fields, or the message's words."""
    if isinstance(exc, ValidationError):
        return one_line(exc)
    return " ".join(str(exc).split()) or type(exc).__name__


def _out_of_time(item: InboxItem, limit: float) -> str:
    return f"the validator of update {item.name!r} ran out of time ({limit:g}s)"
