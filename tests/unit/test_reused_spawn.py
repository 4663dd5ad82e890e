"""A parent's spawn whose create makes no child and that no answer traced back to the
parent: it repeats a request id its partition applied before (answered request-id-reused,
or, naming a run that exists, not at all), or the run it names holds as many requests as it
keeps (answered inbox-full). The parent waited for ever for its child; now its spawn fails
(SpawnRefused), as one refused for an existing or expired run id does."""

from __future__ import annotations

from typing import Any

import pytest

from runstream import ChildFailed, Flow, FlowContext
from runstream.engine.journal import events as ev
from runstream.engine.testing import TestEnvironment
from runstream.projections.decide import inbox_full_rejection
from runstream.projections.outbox_requests import SPAWN_REFUSED
from runstream.projections.state import MAX_INBOX, RunStatus, Verdict, incarnation_id
from tests.builders import PartitionLog, create, request

child: Flow[Any, Any] = Flow("reused-spawn-child")
parent: Flow[Any, Any] = Flow("reused-spawn-parent")


@child.handler
async def _child(ctx: FlowContext, payload: Any) -> Any:
    return "child"


@parent.handler
async def _parent(ctx: FlowContext, child_id: Any) -> Any:
    await ctx.wait_for("go")  # position 0
    spawned = await ctx.spawn(child, 1, run_id=child_id)  # position 1
    try:
        return await spawned.result()
    except ChildFailed as exc:
        return exc.error_type


@pytest.mark.parametrize("taken", ["other", "c"])
async def test_a_spawn_whose_request_id_a_producer_spent_fails(taken: str) -> None:
    # "other": the spawn's create names no run (answered request-id-reused); "c": the
    # producer made the child's id itself under that request id (a run not the parent's).
    async with TestEnvironment([child, parent]) as env:
        await env.start(parent, "c", run_id="p")
        await env.run_until_idle()
        spawn_id = f"spawn/{incarnation_id(env.describe('p'))}/1"
        assert env.log.request(ev.RunCreateRequested, taken, request_id=spawn_id,
                               flow=child.name, payload_json="1") is Verdict.applied
        env.log.request(ev.RunSignalSent, "p", request_id="go", name="go", payload_json="1")
        await env.run_until_idle()
        assert await env.result("p") == SPAWN_REFUSED
        assert env.describe("p").children == ()


def _spawn(request_id: str = "spawn/p@1/1") -> Any:
    return request(ev.RunCreateRequested, run_id="c", request_id=request_id, flow="checkout",
                   payload_json="1", parent_run_id="p", parent_lineage_id="p",
                   parent_position=1)


def test_the_parent_s_own_create_sent_again_is_left_to_its_child() -> None:
    log = PartitionLog()
    offset = log.offset
    assert log.add(_spawn()).verdict is Verdict.applied
    log.add(log.owner.decide(ev.RunCreated, run_id="c", request_id="spawn/p@1/1",
                             flow="checkout", payload_json="1", request_offset=offset,
                             parent_run_id="p", incarnation=offset))
    again = log.add(_spawn())  # (its outbox sent again after a takeover)
    assert again.verdict is Verdict.duplicate and again.outbox == ()


def test_a_spawn_refused_for_a_full_inbox_fails() -> None:
    log = PartitionLog()
    for i in range(MAX_INBOX):  # sent while no owner executed the partition
        log.add(create("c", f"q{i}"))
    refused = log.add(_spawn())
    assert refused.verdict is Verdict.refused
    [wake] = refused.outbox
    assert (wake.type, wake.run_id, wake.request_id) == (ev.RunWakeRequested.TYPE, "p",
                                                         "wake/c/spawn/p@1/1")
    assert SPAWN_REFUSED in wake.body_json and '"position": 1' in wake.body_json
    rejected = log.add(log.owner.decide(ev.RunCreateRejected, run_id="c",
                                        **inbox_full_rejection(log.run("c"), "spawn/p@1/1")))
    assert rejected.outbox == ()  # (told once, at the refusal)
    assert log.run("c").status is RunStatus.pending
