"""The CLI on rounds and quarantines against a real broker: `run result --follow`, a
handed-off round's result, `run status` of a lineage, a quarantine's position, digest and
resolve commands, `run resume --resolution`, and `run status --why`.

The CLI runs as a subprocess and only talks to Kafka, so the flows live here and the worker
runs in-process."""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from runstream import (
    Client,
    Flow,
    FlowContext,
    HandedOff,
    Handoff,
    RunNotFound,
    RunStatus,
    Worker,
)
from runstream.engine.readmodel.describe import SKIP_RESULT_PLACEHOLDER
from tests.integration.test_cli import Result, cli, one_line_error


class TallyOut(BaseModel):
    total: int


relay: Flow[Any, Any] = Flow("relay")
charger: Flow[Any, Any] = Flow("charger")
tally: Flow[Any, TallyOut] = Flow("tally", result=TallyOut)
charging_parent: Flow[Any, Any] = Flow("charging-parent")
flows = [relay, charger, tally, charging_parent]


@charging_parent.handler
async def _charging_parent(ctx: FlowContext, payload: str) -> Any:
    child = await ctx.spawn(charger, payload, run_id=f"{ctx.run_id}-charge")
    return await child.result()


@tally.handler
async def _tally(ctx: FlowContext, n: int) -> TallyOut | Handoff:
    return Handoff(payload=n + 1) if n < 2 else TallyOut(total=n)


@relay.handler
async def _relay(ctx: FlowContext, payload: dict[str, int]) -> Any:
    n = payload["n"]
    if n < 2:
        return Handoff(payload={"n": n + 1})
    return n


async def _charge(order: str) -> str:
    raise TimeoutError(f"the payment gateway did not answer for {order}")


@charger.handler
async def _charger(ctx: FlowContext, payload: str) -> Any:
    return await ctx.step("charge", _charge, payload, irreversible=True)


@asynccontextmanager
async def running(bootstrap: str, namespace: str, tmp_path: Path
                  ) -> AsyncIterator[Client]:
    """An in-process worker of `flows`, and a client."""
    worker = Worker(flows=flows, data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
                    namespace=namespace, session_timeout_ms=6000)
    await worker.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=flows) as client:
            yield client
    finally:
        await worker.stop()


def runner(bootstrap: str, namespace: str, tmp_path: Path) -> Any:
    async def run(*args: str) -> Result:
        return await cli(*args, bootstrap=bootstrap, namespace=namespace,
                         cache=tmp_path / "cache")
    return run


def ok_json(result: Result) -> Any:
    assert result.code == 0, result.err
    return json.loads(result.out)



async def test_cli_follows_a_lineage_and_shows_its_rounds(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    run = runner(bootstrap, namespace, tmp_path)
    async with running(bootstrap, namespace, tmp_path) as client:
        await client.create_run(relay, {"n": 0}, run_id="rl")

        assert ok_json(await run("run", "result", "rl", "--follow", "--timeout", "60")) == 2

        handed = await run("run", "result", "rl")
        assert ok_json(handed) == {"handed_off_to": "rl~1", "round": 1}
        assert "handed off to round 1 (rl~1)" in handed.err and "--follow" in handed.err
        assert ok_json(await run("run", "result", "rl~1")) == {"handed_off_to": "rl~2",
                                                                "round": 2}
        assert ok_json(await run("run", "result", "rl~2")) == 2
        # `<lineage>~0` is round 0 (its records name the lineage): it waited out its timeout
        assert ok_json(await run("run", "result", "rl~0")) == {"handed_off_to": "rl~1",
                                                                "round": 1}
        assert await client.get_handle("rl~0").result(timeout=10) == HandedOff("rl~1", 1)
        assert await client.journal("rl~0") == await client.journal("rl")
        # `run create --wait` of a round that hands off prints it (a traceback before)
        made = await run("run", "create", "relay", "--payload", '{"n": 1}', "--id", "rm",
                         "--wait", "--timeout", "60")
        out = ok_json(made)
        assert (out["run_id"], out["status"]) == ("rm", "handed-off")
        assert out["result"] == {"handed_off_to": "rm~1", "round": 1}
        assert "handed off to round 1 (rm~1)" in made.err
        # Followed, a typed flow's last round's result is its type (a dict before)
        typed = await client.create_run(tally, 0, run_id="tl")
        assert await typed.result(timeout=60, follow=True) == TallyOut(total=2)

        latest = ok_json(await run("run", "status", "rl", "--json"))
        assert latest["run_id"] == "rl~2" and latest["round"] == 2
        assert latest["lineage"] == "rl" and latest["status"] == "completed"
        assert latest["result"] == 2 and latest["ceiling"] == "any"
        assert "handed_off_to" not in latest and "max_rounds" not in latest

        first = ok_json(await run("run", "status", "rl~0", "--json"))
        assert first["run_id"] == "rl" and first["round"] == 0
        assert first["handed_off_to"] == "rl~1" and first["status"] == "completed"

        text = await run("run", "status", "rl~1", "--why")
        assert text.code == 0, text.err
        assert "round: 1  lineage: rl  handed off to rl~2" in text.out
        assert "handed off to round 2: rl~2" in text.out

        why = ok_json(await run("run", "status", "rl~1", "--why", "--json"))["why"]
        assert why["handed_off_to"] == {"run_id": "rl~2", "round": 2}
        assert why["last_activation"]["mode"] == "new"


async def _quarantined(client: Client, run_id: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            run = await client.describe(run_id)
        except RunNotFound:  # (a child not spawned yet)
            run = None
        if run is not None and run.status is RunStatus.suspended and run.wait is not None \
                and run.wait.kind == "quarantine":
            return
        assert time.monotonic() < deadline, f"{run_id} never quarantined: {run}"
        await asyncio.sleep(0.2)


async def test_cli_shows_and_resolves_a_quarantine(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    run = runner(bootstrap, namespace, tmp_path)
    async with running(bootstrap, namespace, tmp_path) as client:
        handle = await client.create_run(charger, "o-1", run_id="q1")
        await _quarantined(client, "q1")

        status = ok_json(await run("run", "status", "q1", "--json"))
        quarantine = status["quarantine"]
        position, digest = quarantine["position"], quarantine["digest"]
        assert position == 0 and isinstance(digest, str) and digest
        assert status["wait"]["kind"] == "quarantine" and status["wait"]["digest"] == digest
        assert quarantine["retry"] == shlex.join([
            "runstream", "run", "resume", "q1", "--namespace", namespace, "--resolution",
            "retry", "--position", "0", "--digest", digest])
        text = await run("run", "status", "q1")
        assert text.code == 0, text.err
        assert f"quarantined at position 0, digest {digest}" in text.out
        assert quarantine["retry"] in text.out and quarantine["skip"] in text.out

        # Bad resolutions: refused before anything is sent, or by the run itself.
        wrong = one_line_error(await run(
            "run", "resume", "q1", "--resolution", "skip", "--position", str(position),
            "--digest", "0" * 16, "--result", '"x"'))
        assert "cannot be resumed" in wrong and "digest" in wrong and digest in wrong
        no_result = one_line_error(await run(
            "run", "resume", "q1", "--resolution", "skip", "--position", "0",
            "--digest", digest))
        assert "--resolution skip needs --result" in no_result
        no_digest = one_line_error(await run(
            "run", "resume", "q1", "--resolution", "retry", "--position", "0"))
        assert "needs --digest" in no_digest
        not_json = one_line_error(await run(
            "run", "resume", "q1", "--resolution", "skip", "--position", "0",
            "--digest", digest, "--result", "{oops"))
        assert "--result is not valid JSON" in not_json
        plain = one_line_error(await run("run", "resume", "q1"))
        assert "quarantined at position 0" in plain
        sideways = one_line_error(await run(
            "run", "resume", "q1", "--resolution", "sideways", "--position", "0",
            "--digest", digest))
        assert "--resolution must be retry or skip, not 'sideways'" in sideways
        stray = one_line_error(await run("run", "resume", "q1", "--digest", digest))
        assert "--digest only go with --resolution" in stray

        why = await run("run", "status", "q1", "--why")
        assert why.code == 0, why.err
        assert "evidence quarantine: " in why.out and "may or may not have taken effect" in why.out
        assert "refused record" in why.out  # the wrong digest (and the plain resume)
        report = ok_json(await run("run", "status", "q1", "--why", "--json"))["why"]
        assert [e["kind"] for e in report["evidence"]] == ["quarantine"]
        assert report["verdicts"]["refused"]["types"] == {"run.resume-requested": 2}
        assert report["last_activation"]["mode"] == "new"
        assert (await client.describe("q1")).status is RunStatus.suspended

        # The skip command `run status` printed, with the result filled in.
        words = shlex.split(quarantine["skip"])
        assert words[:3] == ["runstream", "run", "resume"]
        words[words.index(SKIP_RESULT_PLACEHOLDER)] = '"x"'
        resolved = ok_json(await run(*words[1:], "--json"))
        assert resolved == {"run_id": "q1", "resume_requested": True, "resolution": "skip",
                            "position": 0, "digest": digest, "result": "x"}
        assert await handle.result(timeout=60) == "x"

        assert ok_json(await run("run", "result", "q1")) == "x"
        done = ok_json(await run("run", "status", "q1", "--json"))
        assert done["status"] == "completed" and "quarantine" not in done

        # A parent waiting for a quarantined child says the child needs an operator (it
        # said only which child it waited for).
        await client.create_run(charging_parent, "o-2", run_id="qp")
        await _quarantined(client, "qp-charge")
        parent = ok_json(await run("run", "status", "qp", "--json"))
        assert parent["note"] == (
            "waiting for child run qp-charge; the child is quarantined and needs an "
            "operator: runstream run status qp-charge")
