"""A create request only a plain producer could write (a client, the CLI and the relay check
these before sending) is rejected by the owner, saying why: a run of an empty or malformed
flow name waited for ever, an id no command can address could never be cancelled, a
create of round -1 made a first handoff overwrite the run, and a timeout of 0 or less, or
of millennia, made a deadline that stopped the owner's deadline sweep and every listing of
the run. A client's timeout over 100 years is refused before anything is sent."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from runstream import Flow, FlowContext
from runstream.engine.config import DurationInvalid
from runstream.engine.journal import events as ev
from runstream.engine.journal.records import request_envelope
from runstream.engine.journal.timetext import iso_time
from runstream.engine.testing import TestEnvironment

echo: Flow[Any, Any] = Flow("invalid-echo")


@echo.handler
async def _echo(ctx: FlowContext, payload: Any) -> Any:
    return payload


@pytest.mark.parametrize(("run_id", "fields", "reason"), [
    ("a", {"flow": ""}, "flow-invalid"),
    ("b", {"flow": "bad flow/../x"}, "flow-invalid"),
    ("c d", {}, "run-id-invalid"),
    ("e" * 1500, {}, "run-id-invalid"),
    ("f", {"round": -1}, "lineage-invalid"),
    ("g", {"round": 3}, "lineage-invalid"),
    ("h", {"lineage_id": "other"}, "lineage-invalid"),
    ("i", {"run_timeout_ms": 0}, "run-timeout-invalid"),
    ("j", {"run_timeout_ms": -5}, "run-timeout-invalid"),
    ("k", {"run_timeout_ms": 2**62}, "run-timeout-invalid"),
    ("m", {"max_rounds": -3}, "max-rounds-invalid"),
    ("n~1", {"lineage_id": "n"}, "run-id-invalid"),  # (a handoff of n took it over)
])
async def test_the_owner_rejects_what_no_run_may_ask_for(
        run_id: str, fields: dict[str, Any], reason: str) -> None:
    async with TestEnvironment([echo]) as env:
        lineage = fields.pop("lineage_id", run_id)
        body = {"flow": echo.name, "payload_json": "1", **fields}
        envelope = request_envelope(ev.RunCreateRequested.TYPE, run_id, lineage_id=lineage,
                                    request_id=f"plain/{run_id[:8]}", now_ms=env.clock_ms)
        env.log.append(0, ev.RunCreateRequested(envelope=envelope, **body))
        await env.run_until_idle()
        assert run_id not in env.projection.runs
        rejected = [h.record for h in env.history(run_id)
                    if isinstance(h.record, ev.RunCreateRejected)]
        assert [r.reason for r in rejected] == [reason]
        # and nothing else of the partition stopped
        assert await env.run(echo, 2) == 2


async def test_a_timeout_over_a_century_is_refused_before_anything_is_sent() -> None:
    with pytest.raises(DurationInvalid, match="at most 100 years"):
        Flow("too-patient", timeout=timedelta(days=40_000))
    async with TestEnvironment([echo]) as env:
        with pytest.raises(DurationInvalid, match="at most 100 years"):
            await env.start(echo, 1, run_timeout=timedelta(days=3_000_000))
        assert env.projection.runs == {}


def test_a_time_no_iso_text_can_show_is_still_shown() -> None:
    assert iso_time(2**62) == f"after the year 9999 ({2**62} ms from the epoch)"
    assert iso_time(-(2**62)) == f"before the year 1 ({-(2**62)} ms from the epoch)"
    assert iso_time(0) == "1970-01-01T00:00:00.000Z"
