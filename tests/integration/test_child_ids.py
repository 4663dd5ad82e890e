"""A child's chosen id is held to a client's rules on a real broker, whichever door created
its parent (a client with the Flow object, one by flow name, the CLI, a create request a
plain producer writes from schemas/ alone): an id no client or CLI could address fails the
parent with SpawnRefused and creates nothing; a valid one, `~` inside it too, is kept."""

from __future__ import annotations

from pathlib import Path

import pytest

from runstream import RunFailed, RunNotFound, Worker
from tests.integration.child_id_flows import ACCEPTED, REFUSED, chooser, flows
from tests.integration.support import fold
from tests.integration.test_lifetime import DOORS, doors


async def test_a_chosen_child_id_is_checked_through_every_door(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    worker = Worker(flows=flows, data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
                    namespace=namespace)
    await worker.start()
    try:
        async with doors(bootstrap, namespace, journal, tmp_path) as (client, create):
            for door in DOORS:
                for n, child_id in enumerate(REFUSED):
                    await create(door)(chooser, child_id, f"{door}-bad-{n}")
                for n, child_id in enumerate(ACCEPTED):
                    await create(door)(chooser, f"{door}-{child_id}", f"{door}-ok-{n}")
            for door in DOORS:
                for n, why in enumerate(REFUSED.values()):
                    with pytest.raises(RunFailed, match="SpawnRefused") as failed:
                        await client.get_handle(f"{door}-bad-{n}").result(timeout=60)
                    assert why in str(failed.value)
                for n, child_id in enumerate(ACCEPTED):
                    result = await client.get_handle(f"{door}-ok-{n}").result(timeout=60)
                    assert result == f"child {door}-{child_id}"
                    assert (await client.describe(f"{door}-{child_id}")).status == "completed"
            with pytest.raises(RunNotFound):
                await client.describe("other~2")
    finally:
        await worker.stop()
    view = await fold(bootstrap, namespace)
    assert not set(REFUSED) & set(view.history), "a refused child was created"
