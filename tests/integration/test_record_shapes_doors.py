"""Issue 22's record shapes through every door: a 3-step run created with a Flow object, by
flow name, by the CLI, or by a create request a plain producer writes from schemas/ alone
writes 5 records (its first activation inside run.created, its last step inside
run.completed), and its state holds all three steps. The worker read back its own
decisions as it built them, without decoding them, and its projection verifies."""

from __future__ import annotations

from pathlib import Path

import pytest

from runstream.engine.demo.flows import checkout
from runstream.engine.journal import events as ev
from runstream.engine.ops import verify as integrity
from tests.conftest import TEST_JOURNAL_PARTITIONS
from tests.integration.support import fold, until
from tests.integration.test_lifetime import DOORS, doors, worker


@pytest.mark.parametrize("door", DOORS)
async def test_a_3_step_run_writes_5_records_through_every_door(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path, door: str
) -> None:
    run_id = f"shape-{door}"
    async with worker(bootstrap, namespace, tmp_path / "w", [checkout]) as w, \
            doors(bootstrap, namespace, journal, tmp_path) as (client, create):
        await create(door)(checkout, {"order_id": run_id, "amount": 1}, run_id)
        result = await client.get_handle(run_id).result(timeout=60)
        assert result["order_id"] == run_id
        # its claims and the run's 3 decisions were read back as built, not decoded (and,
        # under RUNSTREAM_CHECK_OWN_RECORDS, decoded as well and found the same)
        await until(lambda: w.sent.reused >= TEST_JOURNAL_PARTITIONS + 3, "the read-back")
        assert w.sent.check
    report = await integrity.verify(bootstrap=bootstrap, namespace=namespace,
                                    data_dir=tmp_path / "w")
    assert report.ok, report.as_dict()
    view = await fold(bootstrap, namespace)
    records = [item.record for item in view.history[run_id] if item.record is not None]
    assert [r.TYPE for r in records] == [
        ev.RunCreateRequested.TYPE, ev.RunCreated.TYPE, ev.StepCompleted.TYPE,
        ev.StepCompleted.TYPE, ev.RunCompleted.TYPE]
    created, completed = records[1], records[-1]
    assert isinstance(created, ev.RunCreated) and created.activated
    assert isinstance(completed, ev.RunCompleted) and completed.final_step_name == "receipt"
    run = view.runs[run_id]
    assert run is not None and run.activations == 1 and run.steps == 3
    assert sorted(view.store.entries[run_id]) == [0, 1, 2]
