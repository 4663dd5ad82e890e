"""A request no worker answers in time stands in the journal, and the error says so (a
caller told only "not admitted" or "no answer" sent it again, and once a worker came, the
signal was delivered twice, the schedule triggered twice)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runstream import Client, ResultTimeout
from runstream.engine.client import schedules, starts


async def test_a_request_no_worker_answers_in_time_says_it_stands(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(starts, "ADMISSION_TIMEOUT_S", 2.0)
    monkeypatch.setattr(schedules, "ANSWER_TIMEOUT_S", 2.0)
    async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                      read_model_dir=tmp_path / "rm") as client:
        with pytest.raises(ResultTimeout, match="send it again only under its request id 'q1'"):
            await client.signal_with_start("some-flow", None, run_id="s1", signal="go",
                                           request_id="q1")
        with pytest.raises(ResultTimeout, match="is in the journal and applies when a worker "
                                                "runs: do not send it again"):
            await client.create_schedule("hb", "some-flow", None, every=60)
