"""Retention covers schedules on a real broker: under RUNSTREAM_RETENTION=3s a worker
process journals the expiry of a deleted schedule's state once it has been deleted longer
than that (its fired runs expire as runs), the worker's RocksDB store verifies against a
rebuild, and the id, created again, fires afresh; a live schedule is kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runstream import Client, RunExpired, ScheduleNotFound
from runstream.engine.journal import events as ev
from runstream.engine.ops import verify as integrity
from tests.integration.support import WorkerProcess, fold
from tests.integration.test_cli import cli
from tests.integration.test_retention import is_expired, until
from tests.integration.test_schedules import APP, _fired, beat


async def _gone(bootstrap: str, namespace: str, schedule_id: str) -> bool:
    view = await fold(bootstrap, namespace)
    return any(schedule_id in item.record.schedules
               for history in view.partition_history.values() for item in history
               if isinstance(item.record, ev.PartitionRunsExpired))


async def test_a_deleted_schedule_expires_and_its_id_starts_afresh(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RUNSTREAM_RETENTION", "3s")
    monkeypatch.setenv("RUNSTREAM_TOMBSTONE_RETENTION", "10m")  # outlives the checks
    data_dir = tmp_path / "w"
    worker = WorkerProcess(bootstrap, namespace, data_dir, "w", tmp_path / "effects",
                           app=APP).start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[beat]) as client:
            await client.create_schedule("doomed", beat, {"n": 1}, every=1)
            await client.create_schedule("lasting", beat, {"n": 2}, every=1)
            fired = await _fired(client, "doomed", 2)
            await client.delete_schedule("doomed")
            with pytest.raises(ScheduleNotFound):
                await client.describe_schedule("doomed")
            await until(lambda: _gone(bootstrap, namespace, "doomed"),
                        "the deleted schedule's expiry", timeout=90)
            await until(lambda: is_expired(client, fired[0].run_id),
                        "its fired run's expiry", timeout=60)
            lasting = await client.describe_schedule("lasting")
            assert lasting.fires >= 2
            # Its runs retention removed are `expired` to the Client as to the CLI (the
            # Client said `completed`, and the run's status raised RunExpired).
            expired = [f.run_id for f in lasting.recent if f.status == "expired"]
            assert expired, lasting.recent
            with pytest.raises(RunExpired):
                await client.status(expired[0])
            shown = await cli("schedule", "describe", "lasting", "--json", bootstrap=bootstrap,
                              namespace=namespace, cache=tmp_path / "c")
            assert shown.code == 0, shown.err
            said = {r["run_id"]: r["status"] for r in json.loads(shown.out)["recent_runs"]}
            assert all(said.get(run_id, "expired") == "expired" for run_id in expired), said
            await client.create_schedule("doomed", beat, {"n": 3}, every=1)
            again = await _fired(client, "doomed", 1)
            fresh = await client.describe_schedule("doomed")
            assert again and fresh.skipped == 0
            assert not {f.run_id for f in fired} & {f.run_id for f in fresh.recent}
        report = await integrity.verify(bootstrap=bootstrap, namespace=namespace,
                                        data_dir=data_dir)
        assert report.ok, report.as_dict()
    finally:
        assert worker.stop() == 0, worker.log_text()[-3000:]
    view = await fold(bootstrap, namespace)
    schedule = view.store.schedule("doomed")
    assert schedule is not None and schedule.exists and schedule.fires >= 1
    assert view.store.schedule("lasting") is not None
