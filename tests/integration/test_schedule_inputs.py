"""A schedule's inputs on a real broker, through every door (tests/unit/
test_schedule_inputs_env.py: the same in the TestEnvironment): a burst of changes past the
pending bound is answered, each refused one at once (they waited 30 s and heard "is a worker
up?"); a plain producer's spec no run could be created from is refused; the CLI's backfill
takes the times `describe` prints; an update keeps a pause's note; a schedule made again
counts from 0; a fire whose create cannot be sent frees its schedule (it skipped every later
instant for ever)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from runstream import Client, InvalidInput, ScheduleNotFound, ScheduleRejected
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import RecordTooLarge
from runstream.engine.journal.timetext import iso_time as iso
from runstream.projections.schedule_state import MAX_CHANGES
from tests.integration.support import fold, running_worker, until
from tests.integration.test_cli import cli, one_line_error
from tests.integration.test_lifetime import produce_plain
from tests.integration.test_schedules import _change_bytes, beat, flows


async def test_a_burst_bad_specs_the_cli_s_times_notes_and_counts(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows) as client:
        await client.create_schedule("burst", beat, None, every=3600, overlap="allow_all")
        began = time.monotonic()
        answers = await asyncio.gather(*[client.trigger_schedule("burst") for _ in range(40)],
                                       return_exceptions=True)
        assert time.monotonic() - began < 20  # (none waited for the 30 s timeout)
        fired = [a for a in answers if isinstance(a, str)]
        refused = [a for a in answers if not isinstance(a, str)]
        assert len(fired) >= MAX_CHANGES and len(fired) + len(refused) == 40
        for answer in refused:
            assert isinstance(answer, ScheduleRejected), answer
            assert "send the trigger again" in str(answer)
        assert (await client.describe_schedule("burst")).fires == len(fired)

        for sid, fields in (("bogus", {"action": "bogus"}),
                            ("both", {"cron": "0 * * * *", "every_ms": 60_000}),
                            ("notjson", {"every_ms": 60_000, "payload_json": "{not json"}),
                            ("untimed", {"every_ms": 60_000, "run_timeout_ms": -1}),
                            ("huge", {"every_ms": 2**63 - 1, "offset_ms": 1000}),
                            # (shown with its offset, fired without it)
                            ("cronoffset", {"cron": "0 * * * *", "offset_ms": 600_000}),
                            # (a thousand runs a second)
                            ("flood", {"every_ms": 1})):
            await produce_plain(bootstrap, journal, sid, _change_bytes(
                sid, **{"action": "create", "flow": beat.name, **fields}),
                record_type="schedule.change-requested")
        with pytest.raises(InvalidInput, match="every must be at least 1 s, not 500 ms"):
            await client.create_schedule("fast", beat, None, every=0.5)
        with pytest.raises(InvalidInput, match="over the 524288-byte limit"):
            await client.create_schedule("big", beat, "x" * 600_000, every=60)

        cache = tmp_path / "cache"
        offset = await cli("schedule", "create", "cronoffset2", beat.name, "--cron",
                           "0 * * * *", "--offset", "10m", bootstrap=bootstrap,
                           namespace=namespace, cache=cache)
        assert "an offset goes with every, not with cron" in one_line_error(offset)
        flood = await cli("schedule", "create", "flood2", beat.name, "--every", "1ms",
                          bootstrap=bootstrap, namespace=namespace, cache=cache)
        assert "every must be at least 1 s, not 1 ms" in one_line_error(flood)
        made = await cli("schedule", "create", "window", beat.name, "--every", "1h",
                         "--catchup-window", "0s", bootstrap=bootstrap, namespace=namespace,
                         cache=cache)
        assert made.code == 0, made.err
        window = await cli("schedule", "describe", "window", "--json", bootstrap=bootstrap,
                           namespace=namespace, cache=cache)
        assert json.loads(window.out)["catchup_window_ms"] == 10_000, window.err
        now_ms = int(time.time() * 1000)
        await client.create_schedule("hourly", "sched-beat", {"n": 1}, every=3600)
        out = await cli("schedule", "backfill", "hourly", "--start", iso(now_ms - 3 * 3_600_000),
                        "--end", iso(now_ms), bootstrap=bootstrap, namespace=namespace,
                        cache=cache)
        assert out.code == 0, out.err
        assert (await client.describe_schedule("hourly")).fires == 3
        # The same backfill again fires none of them again (it counted them twice, and ran
        # them again once their runs had expired).
        again = await cli("schedule", "backfill", "hourly", "--start",
                          iso(now_ms - 3 * 3_600_000), "--end", iso(now_ms),
                          bootstrap=bootstrap, namespace=namespace, cache=cache)
        assert again.code == 2 and "or a backfill fired it" in again.err, again.err
        assert (await client.describe_schedule("hourly")).fires == 3
        # A start before 1970 is refused by the CLI; sent anyway, by its owner, which went
        # on (its fire's run id overflowed before year 1: the worker stopped, and again at
        # each start, its claim's sweep asking the same).
        out = await cli("schedule", "backfill", "hourly", "--start",
                        "0001-01-01T00:00:00+05:00", "--end", iso(now_ms),
                        bootstrap=bootstrap, namespace=namespace, cache=cache)
        assert out.code == 2 and out.err.strip() == (
            "error: a backfill starts at 1970-01-01T00:00:00Z or later"), out.err
        await produce_plain(bootstrap, journal, "hourly", _change_bytes(
            "hourly", action="backfill", start_ms=-62_135_614_800_000, end_ms=now_ms),
            record_type="schedule.change-requested")
        for args in (("pause", "hourly", "--note", "db migration"),
                     ("update", "hourly", "--payload", '{"n": 2}')):
            done = await cli("schedule", *args, bootstrap=bootstrap, namespace=namespace,
                             cache=cache)
            assert done.code == 0, done.err
        described = await cli("schedule", "describe", "hourly", "--json", bootstrap=bootstrap,
                              namespace=namespace, cache=cache)
        shown = json.loads(described.out)
        assert shown["note"] == "db migration" and shown["payload"] == {"n": 2}
        await client.delete_schedule("hourly")
        await client.create_schedule("hourly", beat, {"n": 1}, every=3600)
        again = await client.describe_schedule("hourly")
        assert (again.fires, again.skipped, again.recent) == (0, 0, ())

    projection = await fold(bootstrap, namespace)
    reasons = {h.record.schedule_id: h.record.reason for p in projection.partition_history
               for h in projection.partition_history[p]
               if isinstance(h.record, ev.ScheduleChangeRejected)}
    assert "no action 'bogus'" in reasons["bogus"]
    assert "cron or every, not both" in reasons["both"]
    assert "Expecting property name" in reasons["notjson"]
    assert "a run timeout is more than 0 ms" in reasons["untimed"]
    assert "an offset goes with every, not with cron" in reasons["cronoffset"]
    assert "every must be at least 1 s, not 1 ms" in reasons["flood"]
    assert reasons["hourly"] == "a backfill starts at 1970-01-01T00:00:00Z or later"
    # (its next fire overflowed the answer's 64 bits: unsent, and the schedule's every
    # later change unanswered behind it)
    assert reasons["huge"].startswith("every must be at most 3153600000000 ms"), reasons


async def test_a_fire_whose_create_cannot_be_sent_frees_its_schedule(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """A payload its schedule's records carry but its fired run's create does not (the
    payload limit raised to a record's): the fire is dead-lettered and its schedule hears
    the run was rejected, so under `skip` the next instants fire."""
    monkeypatch.setenv("RUNSTREAM_MAX_PAYLOAD_BYTES", "1000000")
    big = "big-" + "x" * 120  # (its fired runs' ids, longer than itself, tip their creates)
    async with running_worker(bootstrap, namespace, tmp_path / "w", flows), \
            Client(bootstrap_servers=bootstrap, namespace=namespace, flows=flows) as client:
        size = 899_800
        while True:  # the largest payload the schedule's own records carry
            try:
                await client.create_schedule(big, beat, {"b": "x" * size}, every=2)
                break
            except (RecordTooLarge, ScheduleRejected):
                size -= 50

        async def settled_twice() -> bool:
            try:
                schedule = await client.describe_schedule(big)
            except ScheduleNotFound:
                return False
            return sum(1 for f in schedule.recent if f.status == "rejected") >= 2
        await until(settled_twice, "two fires of 'big' heard as rejected", timeout=60)
        assert (await client.describe_schedule(big)).skipped == 0  # (none for an overlap)
