"""The fencing ledger (`runstream fenced`) against a real broker: a zombie's decision under
a stale epoch, a non-owner's decision, a repeated sequence, a stale claim and a re-sent
request are each listed with their writer, epoch and why; applied records are not."""

from __future__ import annotations

import json
from pathlib import Path

from runstream.engine.cli import operations
from runstream.engine.journal import events as ev
from tests.builders import Writer, create, created
from tests.integration.test_cli import cli, one_line_error
from tests.integration.test_read_model import Journal, claim, run_in


async def test_the_ledger_lists_every_write_turned_away(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    run_id = run_in(1, "fz")
    async with Journal(bootstrap, journal) as writer:
        owner = writer.owners[1]
        offset = await writer.send(create(run_id, "q-1"))
        await writer.send(created(owner, run_id, "q-1", request_offset=offset))
        stale = Writer("old-owner", epoch=0)  # wrote under an epoch the partition has left
        await writer.send(stale.decide(ev.StepCompleted, run_id=run_id, position=0,
                                       name="a", result_json="1"))
        stranger = Writer("stranger", epoch=1)  # the right epoch, but not the owner
        await writer.send(stranger.decide(ev.StepCompleted, run_id=run_id, position=0,
                                          name="a", result_json="2"))
        step = owner.decide(ev.StepCompleted, run_id=run_id, position=0, name="a",
                            result_json="3")
        await writer.send(step)
        await writer.send(step)  # written again after a retry: the same sequence number
        await writer.send(create(run_id, "q-1"))  # a create request sent again
        await writer.send(claim(Writer("late"), 1, "late-worker", generation=2), partition=1)
    where = tmp_path / "rm"
    ledger = await operations.fenced_writes(bootstrap=bootstrap, namespace=namespace,
                                            read_model_dir=where)
    reasons = [(w.run_id, w.writer, w.verdict, w.reason.split(":")[0]) for w in ledger.writes]
    assert reasons == [
        (run_id, "old-owner", "fenced", "stale epoch"),
        (run_id, "stranger", "fenced", "not the owner"),
        (run_id, owner.source_id, "duplicate", "duplicate sequence"),
        (run_id, None, "duplicate", "duplicate request"),
        (None, "late", "rejected", "stale claim"),
    ]
    assert ledger.total == 5
    assert ledger.writes[0].epoch == 0 and ledger.writes[0].detail["result_json"] == "1"
    only_run = await operations.fenced_writes(bootstrap=bootstrap, namespace=namespace,
                                              run_id=run_id, read_model_dir=where)
    assert [w.offset for w in only_run.writes] == [w.offset for w in ledger.writes[:4]]
    limited = await operations.fenced_writes(bootstrap=bootstrap, namespace=namespace,
                                             limit=2, read_model_dir=where)
    assert len(limited.writes) == 2 and limited.total == 5
    common = {"bootstrap": bootstrap, "namespace": namespace, "cache": tmp_path / "cache"}
    out = await cli("fenced", "--json", **common)
    assert out.code == 0, out.err
    assert json.loads(out.out)["total"] == 5
    text = await cli("fenced", "--run", run_id, **common)
    assert "STALE EPOCH" not in text.out and "FENCED: stale epoch" in text.out
    assert "4 write(s) turned away" in text.out
    future = await cli("fenced", "--since", "2999-01-01T00:00:00", "--json", **common)
    assert json.loads(future.out)["total"] == 0
    bad = await cli("fenced", "--since", "soon", **common)
    assert "not an ISO-8601 time" in one_line_error(bad)
