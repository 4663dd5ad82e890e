"""Every whole-number RUNSTREAM_* variable is read by one parser, every duration by another:
unset or blank gives the default, anything else that is not a value in range is refused with
one SettingInvalid naming the variable (never a traceback, a silent clamp or a default), and
`runstream worker` ends with that one line."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta

import pytest

from runstream import InvalidInput, RunstreamError
from runstream.engine import config
from runstream.engine.journal.input_limits import max_payload_bytes
from runstream.engine.journal.settings import SettingInvalid, env_count
from runstream.engine.kafka.decode_ahead import decode_ahead_min
from runstream.engine.readmodel import bootstrap
from runstream.engine.worker import snapshot_reader, snapshots, sticky
from runstream.projections.manifest import CheckpointPolicy

READERS: dict[str, Callable[[], object]] = {
    "RUNSTREAM_MAX_PAYLOAD_BYTES": max_payload_bytes,
    "RUNSTREAM_DECODE_AHEAD_MIN": decode_ahead_min,
    "RUNSTREAM_SNAPSHOT_EVERY": snapshots.resolve_every,
    "RUNSTREAM_SNAPSHOT_CHILD_MIN_KEYS": snapshot_reader.resolve_child_min_keys,
    "RUNSTREAM_STICKY_CACHE": lambda: sticky.sticky_size(None),
    "RUNSTREAM_CHECKPOINT_EVERY": CheckpointPolicy.from_env,
    "RUNSTREAM_CHECKPOINT_KEEP": CheckpointPolicy.from_env,
}
DURATIONS: dict[str, Callable[[], object]] = {
    "RUNSTREAM_RETENTION": config.resolve_retention,
    "RUNSTREAM_TOMBSTONE_RETENTION": lambda: config.resolve_tombstone_retention(
        None, timedelta(days=1)),
    "RUNSTREAM_DURABLE_BACKOFF_AFTER": config.durable_backoff_ms,
}


@pytest.mark.parametrize("name", sorted(READERS))
@pytest.mark.parametrize("bad", ["lots", "1.5", "-1", "9" * 30 + "x"])
def test_a_bad_value_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, name: str,
                                        bad: str) -> None:
    monkeypatch.setenv(name, bad)
    with pytest.raises(SettingInvalid) as refused:
        READERS[name]()
    assert str(refused.value).startswith(f"{name}=")
    assert isinstance(refused.value, InvalidInput) and isinstance(refused.value, ValueError)


@pytest.mark.parametrize("name", sorted(DURATIONS))
def test_a_bad_duration_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setenv(name, "soon")
    with pytest.raises(SettingInvalid, match=f"^{name}='soon' is not a duration"):
        DURATIONS[name]()
    monkeypatch.setenv(name, " ")  # blank: the default
    DURATIONS[name]()


def test_the_read_model_reads_the_workers_snapshot_interval_alike(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for value, expected in (("", snapshots.DEFAULT_EVERY), (" 7 ", 7), ("0", 0)):
        monkeypatch.setenv("RUNSTREAM_SNAPSHOT_EVERY", value)
        assert snapshots.resolve_every() == bootstrap.resolve_every() == expected
    monkeypatch.setenv("RUNSTREAM_SNAPSHOT_EVERY", "-3")
    for read in (snapshots.resolve_every, bootstrap.resolve_every):
        with pytest.raises(SettingInvalid, match="must be 0 or more records"):
            read()


def test_bounds_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNSTREAM_PROBE", raising=False)
    assert env_count("RUNSTREAM_PROBE", 5, unit="things") == 5
    monkeypatch.setenv("RUNSTREAM_PROBE", "  ")
    assert env_count("RUNSTREAM_PROBE", 5, unit="things") == 5
    monkeypatch.setenv("RUNSTREAM_PROBE", "11")
    with pytest.raises(SettingInvalid, match=r"=11 must be between 1 and 10 things \(0: off\)"):
        env_count("RUNSTREAM_PROBE", 5, unit="things", minimum=1, maximum=10, zero="off")
    assert env_count("RUNSTREAM_PROBE", 5, unit="things", maximum=11) == 11


@pytest.mark.parametrize(("name", "said"), [
    ("RUNSTREAM_STICKY_CACHE", "is not a whole number of runs (0: off)"),
    # (read at each create the owner answers: the worker stopped at its first one, which
    # stayed unanswered for the next start to stop at again)
    ("RUNSTREAM_MAX_PAYLOAD_BYTES", "is not a whole number of bytes"),
])
def test_the_worker_command_ends_with_one_line(tmp_path: object, name: str, said: str
                                               ) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "runstream.engine.cli", "worker", "--app",
         "runstream.engine.demo.flows:flows", "--data-dir", str(tmp_path),
         "--bootstrap", "127.0.0.1:1"],
        env={"PATH": "", name: "big"}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"error: {name}='big' {said}"


def test_the_test_environment_says_a_bad_payload_limit_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from runstream.testing import TestEnvironment
    monkeypatch.setenv("RUNSTREAM_MAX_PAYLOAD_BYTES", "1MB")
    with pytest.raises(SettingInvalid, match="RUNSTREAM_MAX_PAYLOAD_BYTES='1MB'"):
        TestEnvironment([])


@pytest.mark.parametrize(("option", "value"), [
    ("retention", -5), ("retention", timedelta(seconds=-5)),
    ("tombstone_retention", timedelta(days=-1)), ("tombstone_retention", "-1h"),
    ("durable_backoff_after", -2.0)])
def test_a_negative_retention_given_to_the_api_is_one_clear_error(
        tmp_path: object, option: str, value: object) -> None:
    """As the CLI's flags and the variables, which take no sign: a negative retention meant
    forever, and a negative tombstone retention forgot each request id at once (a signal
    sent twice with one request id was delivered twice)."""
    from pathlib import Path

    from runstream import DurationInvalid, Worker
    from runstream.testing import TestEnvironment
    with pytest.raises(DurationInvalid):
        Worker(flows=[], data_dir=Path(str(tmp_path)) / "w", bootstrap_servers="127.0.0.1:1",
               **{option: value})
    with pytest.raises(DurationInvalid):
        TestEnvironment([], **{option: value})
    zero = {"retention": "forever", "tombstone_retention": "the retention"}.get(
        option, "every backoff durable")
    said = ("is not a duration" if isinstance(value, str)  # (as the CLI says it)
            else rf"^{option} .* must be 0 \({zero}\) or more$")
    with pytest.raises(DurationInvalid, match=said):
        TestEnvironment([], **{option: value})


@pytest.mark.parametrize("value", ["100", 1.5, True, -1])
def test_a_snapshot_interval_that_is_not_a_whole_count_is_one_clear_error(
        value: object) -> None:
    """A text gave a bare TypeError ('<' not supported), 1.5 was taken."""
    with pytest.raises(snapshots.WorkerFatal, match="must be a whole number of records"):
        snapshots.resolve_every(value)  # type: ignore[arg-type]
    with pytest.raises(RunstreamError, match="must be a whole number of records"):
        bootstrap.resolve_every(value)  # type: ignore[arg-type]
