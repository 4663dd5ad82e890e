"""Issue 22's record shapes through every door: a 3-step run created with a Flow object, by
flow name, by the CLI, or by a create request a plain producer writes from schemas/ alone
writes 5 records (its first activation inside run.created, its last step inside
run.completed), and its state holds all three steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from runstream.engine.demo.flows import checkout
from runstream.engine.journal import events as ev
from tests.integration.support import fold
from tests.integration.test_lifetime import DOORS, doors, worker


@pytest.mark.parametrize("door", DOORS)
async def test_a_3_step_run_writes_5_records_through_every_door(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path, door: str
) -> None:
    run_id = f"shape-{door}"
    async with worker(bootstrap, namespace, tmp_path / "w", [checkout]), \
            doors(bootstrap, namespace, journal, tmp_path) as (client, create):
        await create(door)(checkout, {"order_id": run_id, "amount": 1}, run_id)
        result = await client.get_handle(run_id).result(timeout=60)
        assert result["order_id"] == run_id
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
