"""A child's chosen id is held to a client's rules (characters, length, not a round's id),
in the owner code the worker and TestEnvironment share, by Flow object and by flow name."""

from __future__ import annotations

import pytest

from runstream import RunFailed
from runstream.engine.testing import TestEnvironment
from tests.integration.child_id_flows import ACCEPTED, REFUSED, chooser, flows


@pytest.mark.parametrize("by_name", [False, True], ids=["flow", "name"])
async def test_a_child_id_no_client_could_address_is_refused(by_name: bool) -> None:
    async with TestEnvironment(flows) as env:
        for n, (child_id, why) in enumerate(REFUSED.items()):
            await env.start(chooser.name if by_name else chooser, child_id, run_id=f"p{n}")
            with pytest.raises(RunFailed, match="SpawnRefused") as failed:
                await env.result(f"p{n}", follow=True)
            assert why in str(failed.value)
            assert env.describe(f"p{n}").children == ()  # nothing was spawned


@pytest.mark.parametrize("by_name", [False, True], ids=["flow", "name"])
async def test_a_valid_chosen_child_id_is_kept(by_name: bool) -> None:
    async with TestEnvironment(flows) as env:
        for n, child_id in enumerate(ACCEPTED):
            await env.start(chooser.name if by_name else chooser, child_id, run_id=f"p{n}")
            assert await env.result(f"p{n}", follow=True) == f"child {child_id}"


def test_a_parents_exit_cancels_no_run_that_is_not_its_child() -> None:
    """A spawn of a chosen id naming an existing, unrelated run holds a link to it until the
    refusal comes back; a parent that ends meanwhile cancels its links. The unrelated run
    refuses that cancel (it cancelled it before), a child of the parent's lineage takes it."""
    import json

    from runstream.engine.journal import events as ev
    from runstream.projections.wakes import exit_policy, exit_reason
    from tests.builders import PartitionLog, create, created, request

    log = PartitionLog()
    w = log.owner
    log.add(create("V", "rv", flow="v", payload_json="null"))  # a client's run
    log.add(created(w, "V", "rv", request_offset=1, flow="v", payload_json="null"))
    log.add(create("P", "rp", flow="p", payload_json="null"))
    log.add(created(w, "P", "rp", request_offset=log.offset - 1, flow="p", payload_json="null"))
    log.add(w.decide(ev.RunActivated, run_id="P", mode="new", activation=1, evidence="x"))
    spawned = log.add(w.decide(ev.ChildSpawned, run_id="P", child_run_id="V",
                               child_lineage_id="V", flow="v", position=0,
                               payload_json="null", parent_exit_policy="cancel"))
    policy = exit_policy(log.run("P").children)
    ended = log.add(w.decide(ev.ChildPolicyApplied, run_id="P", cancelled=policy.cancelled,
                             detached=policy.detached,
                             reason=exit_reason(ev.RunCompleted, {})))
    for item in (spawned.outbox[0], ended.outbox[0]):  # V's partition reads both, in order
        cls = ev.RunCreateRequested if item.type == ev.RunCreateRequested.TYPE else (
            ev.RunCancelRequested)
        log.add(request(cls, run_id="V", request_id=item.request_id,
                        **json.loads(item.body_json)))
    assert log.run("V").cancel_requested is None
    # Its own child, spawned by round 0 and cancelled by round 1's exit, takes it.
    log.add(request(ev.RunCreateRequested, run_id="K", request_id="rk", flow="v",
                    payload_json="null", parent_run_id="P", parent_lineage_id="P",
                    parent_position=1))
    log.add(request(ev.RunCancelRequested, run_id="K", request_id="cancel/P~1/K",
                    reason="parent P~1 ended: completed", requested_by="P~1"))
    assert log.run("K").cancel_requested_by == "P~1"
