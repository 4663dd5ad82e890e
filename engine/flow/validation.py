"""Running an update's validator (Flow.validator) as its owner does: in a thread of its own,
with a time limit, its verdict a reason to reject or None. The worker calls it from a thread
of its pool (engine.worker.reactions), the TestEnvironment directly: the same code."""

from __future__ import annotations

import json
import threading
from typing import Any

from runstream.engine.errors import journal_text
from runstream.projections.reactions import RegisteredFlow
from runstream.projections.state import InboxItem

VALIDATOR_LIMIT_S = 5.0  # a validator still running after this rejects its update


def judge(flow: RegisteredFlow, item: InboxItem, limit: float = VALIDATOR_LIMIT_S
          ) -> str | None:
    """None: the update is accepted; else why it is rejected (the validator's message, or
    that it ran out of time; a validator that never returns is abandoned in its thread)."""
    validator: Any = flow.validator_for(item.name or "")
    if validator is None:
        return None
    try:
        payload = json.loads(item.payload_json or "null")
    except ValueError as exc:
        return f"the payload is not JSON: {exc}"
    verdict: list[str | None] = []

    def run() -> None:
        try:
            validator(payload)
            verdict.append(None)
        except Exception as exc:  # its refusal, whatever it raised
            verdict.append(journal_text(str(exc)) or type(exc).__name__)

    thread = threading.Thread(target=run, name=f"runstream-validator-{item.name}",
                              daemon=True)
    thread.start()
    thread.join(limit)
    if not verdict:
        return f"the validator of update {item.name!r} ran out of time ({limit:g}s)"
    return verdict[0]
