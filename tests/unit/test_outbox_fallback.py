"""Outbox requests that can never be sent are given up and answered (projections.outbox_fallback),
in the TestEnvironment as in a worker; a child's payload is held to a client's limit."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runstream import ChildFailed, Flow, FlowContext, RunFailed
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import PAYLOAD_ENV
from runstream.engine.testing import TestEnvironment
from runstream.projections.outbox_fallback import (
    CANCEL_UNDELIVERABLE,
    RESULT_UNDELIVERABLE,
    OldShape,
    give_up,
    request_of,
)
from runstream.projections.state import OutboxItem

child = Flow("big-child")
parent = Flow("big-parent")


@child.handler
async def _child(ctx: FlowContext, payload: Any) -> Any:
    return len(payload)


@parent.handler
async def _parent(ctx: FlowContext, payload: dict[str, Any]) -> Any:
    kid = await ctx.spawn(child, "x" * payload["size"])
    try:
        return await kid.result()
    except ChildFailed as exc:
        return {"error_type": exc.error_type, "message": exc.message}


async def test_an_oversized_child_payload_fails_the_spawn_before_anything_is_journaled(
) -> None:
    async with TestEnvironment([parent, child]) as env:
        with pytest.raises(RunFailed, match="SpawnRefused") as failed:
            await env.run(parent, {"size": 600_000}, run_id="p")
        assert "bytes of JSON, over the" in str(failed.value)
        assert not [i for i in env.history("p") if isinstance(i.record, ev.ChildSpawned)]


async def test_a_spawn_too_large_to_send_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The payload passes a raised payload limit, but its child.spawned (and create
    request) is over one journal record: the spawn is refused as an oversized payload's
    is, nothing journaled. (A test held the handler's records to no send limit: the create
    request went through the outbox's give-up there, while a worker refused the
    child.spawned and failed the parent with EncodeError.)"""
    monkeypatch.setenv(PAYLOAD_ENV, "999000")
    async with TestEnvironment([parent, child]) as env:
        with pytest.raises(RunFailed, match=r"SpawnRefused.*its spawn cannot be journaled"):
            await env.run(parent, {"size": 950_000}, run_id="p")
        assert not [i for i in env.history("p") if isinstance(i.record, ev.ChildSpawned)]
        assert env.given_up == []


def _item(type_: str, request_id: str, run_id: str, body: Any) -> OutboxItem:
    text = body if isinstance(body, str) else json.dumps(body)
    return OutboxItem(request_id=request_id, type=type_, run_id=run_id, lineage_id=run_id,
                      body_json=text)


def test_an_old_shape_body_makes_no_record() -> None:
    old = _item(ev.RunCancelRequested.TYPE, "cancel/p/c", "c", {"why": "renamed field"})
    with pytest.raises(OldShape, match="does not make a record"):
        request_of(old, 0)
    with pytest.raises(OldShape, match="not a request type"):
        request_of(_item("run.completed", "x", "c", {}), 0)


def test_an_unsendable_wake_becomes_a_minimal_failed_wake_under_its_id() -> None:
    wake = _item(ev.RunWakeRequested.TYPE, "wake/p.3", "p", {
        "child_run_id": "p.3", "child_status": "completed", "result_json": "x" * 10,
        "position": 3})
    gone = give_up(wake, "too-large", "990000 bytes")
    assert gone.replacement is not None and gone.evidence is None
    record = request_of(gone.replacement, 0)
    assert isinstance(record, ev.RunWakeRequested)
    assert record.envelope.request_id == "wake/p.3"
    assert (record.child_run_id, record.child_status, record.position) == ("p.3", "failed", 3)
    assert record.error_type == RESULT_UNDELIVERABLE and record.result_json is None
    assert record.error_message == "result could not be delivered: 990000 bytes"


def test_an_unsendable_spawn_wakes_its_parent_even_from_an_unreadable_body() -> None:
    create = _item(ev.RunCreateRequested.TYPE, "spawn/a/b~2/7", "a/b~2.7", "{not json")
    gone = give_up(create, "old-shape", "bad")
    assert gone.replacement is not None
    record = request_of(gone.replacement, 0)
    assert isinstance(record, ev.RunWakeRequested)
    assert record.envelope.run_id == "a/b~2" and record.envelope.lineage_id == "a/b"
    assert (record.child_run_id, record.position, record.error_type) == (
        "a/b~2.7", 7, "SpawnRefused")


def test_an_unsendable_cancel_is_evidence_on_its_sender() -> None:
    cancel = _item(ev.RunCancelRequested.TYPE, "cancel/par/ent/kid", "kid", "[]")
    gone = give_up(cancel, "old-shape", "bad")
    assert gone.replacement is None and gone.evidence is not None
    assert (gone.evidence.run_id, gone.evidence.kind) == ("par/ent", CANCEL_UNDELIVERABLE)
    assert gone.evidence.attributes["child_run_id"] == "kid"
