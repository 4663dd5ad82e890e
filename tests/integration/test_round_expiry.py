"""A lineage that hands off for ever shrinks, against a real broker: each round after the
first expires alone once its handoff is older than the retention, while the lineage lives
on (round 0 stays, so a request naming the lineage still reaches its latest round); a child
whose spawning round expired still wakes the round that holds it now; once the lineage
ends it expires whole, and its id answers with its final round's settlement after the
earlier rounds' tombstones have gone."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from runstream import Client, Flow, FlowContext, Handoff, RunExpired, RunStatus, Worker
from runstream.engine.journal import events as ev
from runstream.engine.timetravel.fork import fork_run
from runstream.projections.state import Verdict
from tests.integration.support import fold, until
from tests.integration.test_cli import cli
from tests.integration.test_lifetime import _create_request_bytes, produce_plain
from tests.integration.test_retention import _status_is, is_expired

ROUNDS = 4  # rounds 0..3 hand off, round 4 waits for "finish"

entity: Flow[Any, Any] = Flow("shrinking-entity")
kid: Flow[Any, Any] = Flow("shrinking-kid")


@entity.handler
async def _entity(ctx: FlowContext, payload: dict[str, Any]) -> Any:
    n = payload["n"]
    if n == 1 and payload.get("kid"):
        await ctx.spawn(kid, None, run_id=payload["kid"])
    if n < ROUNDS:
        return Handoff(payload={**payload, "n": n + 1})
    how = await ctx.wait_for("finish")
    if how == "fail":
        raise ValueError("finished by failing")
    return how


@kid.handler
async def _kid(ctx: FlowContext, payload: Any) -> str:
    return str(await ctx.wait_for("go"))


async def _expired_with(c: Client, run_id: str, settled: str) -> bool:
    try:
        await c.describe(run_id)
    except RunExpired as exc:
        assert f"after it settled {settled}" in str(exc), str(exc)
        return True
    return False


async def test_rounds_expire_alone_and_the_lineage_answers_with_its_final_round(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
) -> None:
    """Lineages created by a Flow, by flow name, by the CLI and by a plain producer from
    schemas/ alone; a 2 s retention, tombstones kept 6 s."""
    worker = Worker(flows=[entity, kid], data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
                    namespace=namespace, session_timeout_ms=6000,
                    retention=timedelta(seconds=2), tombstone_retention=timedelta(seconds=6))
    await worker.start()
    ids = ["by-flow", "by-name", "by-cli", "by-plain"]
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[entity, kid]) as c, \
                Client(bootstrap_servers=bootstrap, namespace=namespace) as nameless:
            by_flow = await c.create_run(entity, {"n": 0, "kid": "the-kid"}, run_id="by-flow")
            await nameless.create_run(entity.name, {"n": 0}, run_id="by-name")
            made = await cli("run", "create", entity.name, "--payload", '{"n": 0}', "--id",
                             "by-cli", bootstrap=bootstrap, namespace=namespace,
                             cache=tmp_path / "cache")
            assert made.code == 0, made.err
            await produce_plain(bootstrap, journal, "by-plain",
                                _create_request_bytes("by-plain", entity.name, {"n": 0}))
            for run_id in ids:
                await until(lambda r=run_id: _status_is(c, f"{r}~{ROUNDS}",  # type: ignore[misc]
                                                        RunStatus.suspended),
                            f"{run_id}'s last round to wait")
            for run_id in ids:
                for n in range(1, ROUNDS):
                    await until(lambda r=f"{run_id}~{n}": is_expired(c, r),  # type: ignore[misc]
                                f"{run_id}~{n} to expire alone")
                first = await c.describe(f"{run_id}~0")
                assert first.handed_off_to == f"{run_id}~1"  # round 0 stays
                latest = await c.describe(run_id)  # the lineage's id: its latest round
                assert (latest.run_id, latest.status) == (f"{run_id}~{ROUNDS}",
                                                          RunStatus.suspended)
            shown = await cli("run", "status", "by-cli~2", bootstrap=bootstrap,
                              namespace=namespace, cache=tmp_path / "cache")
            assert shown.code != 0 and "expired at" in shown.out + shown.err
            # The tree walks on through the rounds that expired alone (it stopped at the
            # first, and the live round went unshown).
            tree = await cli("run", "history", "by-cli", "--tree", "--json",
                             bootstrap=bootstrap, namespace=namespace, cache=tmp_path / "cache")
            assert tree.code == 0, tree.err
            rounds = json.loads(tree.out)["rounds"]
            assert [r["round"] for r in rounds] == list(range(ROUNDS + 1)), tree.out
            assert [r["status"] for r in rounds[1:]] == ["expired"] * (ROUNDS - 1) + [
                "suspended"], tree.out
            # Its owner replays round 4 from its own start, the rounds before it gone.
            forked = await fork_run(bootstrap=None, namespace=None, run_id=f"by-name~{ROUNDS}",
                                    at_record=2, new_run_id="forked", force=True, client=c)
            assert forked.source_run_id == f"by-name~{ROUNDS}" and forked.answered
            await until(lambda: _status_is(c, "forked", RunStatus.suspended), "the fork waits")
            # The earlier rounds' tombstones go; then the lineages end.
            await until(lambda: all(worker.store is not None
                                    and worker.store.tombstone(f"{r}~1") is None
                                    for r in ids), "the early rounds' tombstones to go")
            # The kid's spawning round (by-flow~1) has expired, and its tombstone has gone
            # too: its wake reaches round 4 all the same (it was ignored once the tombstone
            # went, and round 4 held the kid's link for ever: this test's flake, when the
            # kid settled later than 6 s after round 1 expired).
            await c.signal("the-kid", "go", "went")
            assert await c.get_handle("the-kid").result(timeout=60) == "went"

            def kid_let_go() -> bool:
                held = None if worker.store is None else worker.store.run(f"by-flow~{ROUNDS}")
                return held is not None and held.children == ()
            await until(kid_let_go, "the kid's wake to reach the latest round")
            assert worker.store is not None
            wakes = [(item.verdict, item.offset) for item in worker.store.history(
                f"by-flow~{ROUNDS}") if item.type == ev.RunWakeRequested.TYPE]
            assert [verdict for verdict, _ in wakes] == [Verdict.applied], wakes
            # With their tombstones gone too, the tree goes on to the rounds still held.
            tree = await cli("run", "history", "by-cli", "--tree", "--json",
                             bootstrap=bootstrap, namespace=namespace, cache=tmp_path / "cache")
            assert tree.code == 0, tree.err
            rounds = json.loads(tree.out)["rounds"]
            assert rounds[0]["round"] == 0 and rounds[-1]["round"] == ROUNDS, tree.out
            assert rounds[-1]["status"] == "suspended", tree.out
            await c.signal("by-flow", "finish", "fail")
            for run_id in ids[1:]:
                await nameless.signal(run_id, "finish", "done")
            with pytest.raises(Exception, match="finished by failing"):
                await by_flow.result(timeout=60, follow=True)
            await until(lambda: _expired_with(c, "by-flow", "failed"), "by-flow to expire")
            await until(lambda: _expired_with(nameless, "by-name", "completed"),
                        "by-name to expire")
    finally:
        await worker.stop()
    view = await fold(bootstrap, namespace)
    assert view.dead_letters == []
