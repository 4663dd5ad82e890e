"""An operator's resolution on a real broker, through every door that sends one (tests/unit/
test_quarantine_inputs_env.py: the same in the TestEnvironment): a plain producer's skip
whose result is not JSON is refused and the run stays quarantined (it failed for good); a
skip result of another type than the step's fails the run in one line, from the Client with
a Flow, by name, and the CLI; a resolution to a run not quarantined says why."""

from __future__ import annotations

from pathlib import Path

import pytest

from runstream import Client, ResumeRefused, RunFailed, RunStatus
from runstream.engine.journal import events as ev
from runstream.projections.state import Verdict
from tests.integration.quarantine_input_flows import counted, patient
from tests.integration.support import fold, running_worker, status_when
from tests.integration.test_cli import cli
from tests.integration.test_lifetime import plain_request, produce_plain

FLOWS = [counted, patient]


async def test_resolutions_checked_through_every_door(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with running_worker(bootstrap, namespace, tmp_path / "w", FLOWS), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS) as knows, \
            Client(bootstrap_servers=bootstrap, namespace=namespace) as nameless:
        for door in ("flow", "name", "cli"):
            await knows.create_run(counted, None, run_id=f"q-{door}")
        waits = {}
        for door in ("flow", "name", "cli"):
            await status_when(knows, f"q-{door}", RunStatus.suspended)
            waits[door] = (await knows.describe(f"q-{door}")).wait
        wait = waits["flow"]
        assert wait is not None and wait.kind == "quarantine"
        await produce_plain(bootstrap, journal, "q-flow", plain_request(
            "run.resume-requested", "q-flow", operator="plain", resolution="skip",
            position=wait.position, digest=wait.digest, result_json="not json{"),
            record_type="run.resume-requested")
        await knows.resume("q-flow", resolution="skip", position=wait.position,
                           digest=wait.digest, result="abc")
        named = waits["name"]
        assert named is not None
        await nameless.resume("q-name", resolution="skip", position=named.position,
                              digest=named.digest, result="abc")
        by_cli = waits["cli"]
        assert by_cli is not None
        out = await cli("run", "resume", "q-cli", "--resolution", "skip", "--position",
                        str(by_cli.position), "--digest", str(by_cli.digest), "--result",
                        '"abc"', bootstrap=bootstrap, namespace=namespace,
                        cache=tmp_path / "c")
        assert out.code == 0, out.err
        for door in ("flow", "name", "cli"):
            with pytest.raises(RunFailed, match="ResultInvalid: its journaled result") as failed:
                await knows.get_handle(f"q-{door}").result(timeout=60)
            assert "\n" not in str(failed.value)
        result = await cli("run", "result", "q-cli", bootstrap=bootstrap, namespace=namespace,
                           cache=tmp_path / "c")
        assert result.err.count("\n") == 1 and "the result: Input should be" in result.err

        await knows.create_run(patient, None, run_id="w")
        await status_when(knows, "w", RunStatus.suspended)
        with pytest.raises(ResumeRefused, match="the run is not quarantined"):
            await nameless.resume("w", resolution="skip", position=0, digest="x", result=1)
        with pytest.raises(ResumeRefused, match="give them with a resolution"):
            await nameless.resume("w", position=0)
        assert await knows.status("w") is RunStatus.suspended
    projection = await fold(bootstrap, namespace)
    [plain] = [h for h in projection.history["q-flow"]
               if isinstance(h.record, ev.RunResumeRequested) and h.record.operator == "plain"]
    assert plain.verdict is Verdict.refused


async def test_a_second_resolution_is_refused_while_the_first_is_pending(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    """Two operators resolve one quarantine (here with no worker running, so both meet it
    pending): the first stands and the second is refused, saying so. Before, both were told
    it applied: without a worker the second replaced the first, with one it was dropped. A
    skip given no result is refused before it is sent (it recorded null, and the run failed
    on it), as the CLI refuses it; a retry given one too (its result was ignored)."""
    async with Client(bootstrap_servers=bootstrap, namespace=namespace, flows=FLOWS) as one, \
            Client(bootstrap_servers=bootstrap, namespace=namespace) as other:
        async with running_worker(bootstrap, namespace, tmp_path / "a", FLOWS):
            await one.create_run(counted, None, run_id="q-twice")
            await status_when(one, "q-twice", RunStatus.suspended)
        wait = (await one.describe("q-twice")).wait
        assert wait is not None and wait.kind == "quarantine"
        at = {"position": wait.position, "digest": wait.digest}
        with pytest.raises(ResumeRefused, match="a skip needs a result"):
            await one.resume("q-twice", resolution="skip", **at)
        with pytest.raises(ResumeRefused, match="only a skip records a result"):
            await one.resume("q-twice", resolution="retry", result=5, **at)
        await one.resume("q-twice", resolution="skip", result=111, **at)
        with pytest.raises(ResumeRefused, match=r"pending already \(skip, result '111'\): "
                                                "the first one stands"):
            await other.resume("q-twice", resolution="skip", result=222, **at)
        out = await cli("run", "resume", "q-twice", "--resolution", "retry", "--position",
                        str(wait.position), "--digest", str(wait.digest), bootstrap=bootstrap,
                        namespace=namespace, cache=tmp_path / "c")
        assert out.code != 0 and "pending already (skip" in out.err, out
        async with running_worker(bootstrap, namespace, tmp_path / "b", FLOWS):
            assert await one.get_handle("q-twice").result(timeout=60) == 112
