"""An operator's resolution, checked (review of the quarantine): a skip's result that is not
JSON is refused (applied, it failed the run for good); one the step's return type does not
read fails the step in one line (pydantic's several, as the run's error); a resolution to a
run that is not quarantined, or a position without a resolution, says why
(tests/integration/test_quarantine_inputs.py: the same on a broker)."""

from __future__ import annotations

from typing import Any

import pytest

from runstream import ResumeRefused, RunFailed, RunStatus
from runstream.engine.journal import events as ev
from runstream.engine.journal.records import request_envelope
from runstream.projections.requests import describe_refusal
from runstream.projections.state import Verdict
from runstream.testing import TestEnvironment
from tests.integration.quarantine_input_flows import counted, mistyped, patient


def plain_resume(run_id: str, **fields: Any) -> ev.RunResumeRequested:
    return ev.RunResumeRequested(
        envelope=request_envelope(ev.RunResumeRequested.TYPE, run_id, request_id="plain",
                                  now_ms=0), operator="plain", **fields)


async def test_a_skip_result_not_json_is_refused_and_one_of_another_type_fails_in_a_line(
) -> None:
    async with TestEnvironment([counted]) as env:
        run_id = await env.start(counted, None, run_id="q")
        await env.run_until_idle()
        wait = env.describe(run_id).wait
        assert wait is not None and wait.kind == "quarantine"
        bad = plain_resume(run_id, resolution="skip", position=wait.position,
                           digest=wait.digest, result_json="not json{")
        env.log.append(env.partition_of(run_id), bad)
        [verdict] = [h.verdict for h in env.history(run_id) if h.record == bad]
        assert verdict is Verdict.refused
        assert describe_refusal(env.describe(run_id), bad) == "the skip's result is not JSON"
        assert env.describe(run_id).status is RunStatus.suspended  # (still quarantined)
        await env.resume(run_id, resolution="skip", position=wait.position,
                         digest=wait.digest, result="abc")
        with pytest.raises(RunFailed) as failed:
            await env.result(run_id)
        assert str(failed.value).count("\n") == 0, str(failed.value)
        assert "ResultInvalid" in str(failed.value)
        assert "its journaled result \"abc\" does not fit the step's return type: " \
               "the result: Input should be a valid integer" in str(failed.value)


async def test_a_resolution_for_a_run_not_quarantined_says_why() -> None:
    async with TestEnvironment([patient]) as env:
        run_id = await env.start(patient, None, run_id="w")
        await env.run_until_idle()
        with pytest.raises(ResumeRefused, match="the run is not quarantined"):
            await env.resume(run_id, resolution="skip", position=0, digest="x", result=1)
        with pytest.raises(ResumeRefused, match="resolution must be retry or skip"):
            await env.resume(run_id, resolution="bogus", position=0, digest="x")
        with pytest.raises(ResumeRefused, match="give them with a resolution"):
            await env.resume(run_id, position=0)
        assert env.describe(run_id).status is RunStatus.suspended  # its wait goes on
        await env.signal(run_id, "go", 7)
        assert await env.result(run_id) == 7


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")  # (its dump of the 1.5)
async def test_a_result_its_type_refuses_reads_the_same_first_and_on_replay() -> None:
    """The first run raised pydantic's ValidationError, a replay StepFailed (ResultInvalid):
    a worker with its sticky cache returned the one, without it the other."""
    async with TestEnvironment([mistyped]) as env:
        assert await env.run(mistyped, None) == "StepFailed"


def test_a_second_resolution_is_refused_while_the_first_is_pending() -> None:
    """Accepted, it replaced the first (no worker ran) or was dropped (one did), and its
    operator was told it applied either way."""
    from runstream.projections.requests import apply_run_request
    from runstream.projections.state import RunState, Wait

    run = RunState(run_id="q", lineage_id="q", partition=0, flow="f", payload_json="null",
                   request_id="c", request_offset=0, created_at_ms=0, updated_at_ms=0,
                   status=RunStatus.suspended, admitted=True,
                   wait=Wait(kind="quarantine", position=0, digest="d"))
    first = plain_resume("q", resolution="skip", position=0, digest="d", result_json="111")
    change = apply_run_request(run, first, "r1", 1, None)
    assert change is not None and change.verdict is Verdict.applied
    pending = change.run
    for second in (plain_resume("q", resolution="skip", position=0, digest="d",
                                result_json="222"),
                   plain_resume("q", resolution="retry", position=0, digest="d")):
        again = apply_run_request(pending, second, "r2", 2, None)
        assert again is not None and again.verdict is Verdict.refused
        assert again.run.resolution_result_json == "111"
        assert describe_refusal(pending, second) == (
            "a resolution of this quarantine is pending already (skip, result '111'): the "
            "first one stands")


async def test_a_skip_needs_a_result_and_a_retry_takes_none() -> None:
    """A skip given no result recorded null (the run failed reading it), as the CLI refuses
    it; a retry ignored one given. None is a result: JSON null."""
    async with TestEnvironment([counted]) as env:
        run_id = await env.start(counted, None, run_id="q")
        await env.run_until_idle()
        wait = env.describe(run_id).wait
        assert wait is not None
        at = {"position": wait.position, "digest": wait.digest}
        with pytest.raises(ResumeRefused, match="a skip needs a result"):
            await env.resume(run_id, resolution="skip", **at)
        with pytest.raises(ResumeRefused, match="only a skip records a result"):
            await env.resume(run_id, resolution="retry", result=1, **at)
        with pytest.raises(ResumeRefused, match="only a skip records a result"):
            await env.resume(run_id, result=1)
        assert env.describe(run_id).status is RunStatus.suspended
        await env.resume(run_id, resolution="skip", result=None, **at)
        with pytest.raises(RunFailed, match="its journaled result null"):
            await env.result(run_id)
