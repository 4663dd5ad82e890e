"""A parent's spawn whose request id a plain producer spent first on the child's partition,
on a real broker: the spawn's create is a duplicate that makes no child, and no answer
reached the parent, which waited for ever. Its spawn now fails (SpawnRefused)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from runstream import Client
from runstream.projections.partitioning import run_partition
from tests.conftest import TEST_JOURNAL_PARTITIONS
from tests.integration.support import all_ready, until
from tests.integration.test_lifetime import plain_request, produce_plain, worker
from tests.unit.test_reused_spawn import child, parent  # (the env test's flows)


async def test_a_spawn_whose_request_id_was_spent_fails_its_parent_s_spawn(
        bootstrap: str, namespace: str, journal: str, tmp_path: Path) -> None:
    kid = "kid"
    home = run_partition(kid, TEST_JOURNAL_PARTITIONS)
    other = next(r for r in (f"other-{n}" for n in range(1000))
                 if run_partition(r, TEST_JOURNAL_PARTITIONS) == home)
    async with worker(bootstrap, namespace, tmp_path / "w", [child, parent]) as w, \
            Client(bootstrap_servers=bootstrap, namespace=namespace) as client:
        await until(lambda: all_ready(w), "the worker claimed every partition")
        handle = await client.create_run(parent.name, kid, run_id="p")
        await handle.admitted(timeout=30)
        spawn_id = f"spawn/p@{(await client.describe('p')).incarnation}/1"
        await produce_plain(bootstrap, journal, other, plain_request(
            "run.create-requested", other, request_id=spawn_id, flow=child.name,
            payload_json=json.dumps(1)))
        assert await client.get_handle(other).result(timeout=30) == "child"
        await client.signal("p", "go", 1)
        assert await asyncio.wait_for(handle.result(timeout=60), 70) == "SpawnRefused"
