"""The command line refuses bad input with one `error:` line and exit code 2 before it
connects (no traceback): timeouts that would wait for ever, unusable bootstrap addresses and
TLS files, a worker's log level, data dir, app and concurrency, registry URLs, durations too
long for a timedelta. `--json` is taken by `broker status`, `topics create`, `projection
rebuild`, and by `run create` and `run result`, which print JSON anyway.

In process, through the CLI's own entry point (run_cli) as `runstream` runs it; the
bootstrap is 127.0.0.1:1, where nothing listens (a command that got that far exits 3)."""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest

from runstream import Client, InvalidInput
from runstream.engine.cli import cli, operations
from runstream.engine.cli import projection as projection_cli
from runstream.engine.cli import topics as topics_cli
from runstream.engine.cli.errors import EXIT_USER, run_cli
from runstream.engine.journal.input_limits import AUTHORITY_NAME_ENV
from runstream.engine.kafka.admin import TopicReport, TopicResult
from runstream.engine.kafka.connection import ENVIRONMENT
from runstream.engine.worker.relay import AUTHORITIES_ENV
from runstream.projections.fold import Difference, RebuildReport

APP = "tests.ui.flows:flows"


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def runstream(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
              tmp_path: Path) -> Any:
    """`runstream ARGS...` in this process, as in a fresh one: what a command exports into
    the environment (the security settings, straight into os.environ) is put back after
    the test. (monkeypatch.delenv of a variable not set records nothing to put back: the
    exported settings leaked into every later test of the process, and the broker tests'
    workers there inherited a TLS file that does not exist.)"""
    aiokafka = logging.getLogger("aiokafka")
    level = aiokafka.level
    exported = (*ENVIRONMENT.values(), AUTHORITY_NAME_ENV, AUTHORITIES_ENV)
    for variable in exported:  # (recorded: put back, or removed, at the test's end)
        monkeypatch.setenv(variable, "")

    def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
        for variable in exported:
            monkeypatch.delenv(variable, raising=False)
        monkeypatch.setenv("RUNSTREAM_BOOTSTRAP", "127.0.0.1:1")
        monkeypatch.setenv("RUNSTREAM_CACHE_DIR", str(tmp_path / "cache"))
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(sys, "argv", ["runstream", *args])
        code = 0
        try:
            run_cli(cli)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        finally:
            aiokafka.setLevel(level)
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return invoke


@pytest.fixture
def no_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """A `runstream worker` whose options pass fails the test instead of serving."""
    async def serve(**options: Any) -> None:
        raise AssertionError(f"a worker was started with {options}")

    monkeypatch.setattr(operations, "serve_worker", serve)


def one_line_error(result: Result) -> str:
    assert result.code == EXIT_USER, result
    assert "Traceback" not in result.err + result.out, result.err
    lines = [line for line in result.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.err
    return lines[0]


def click_error(result: Result, option: str) -> str:
    """A usage error click finds in an option, in one line as every other error (exit 2)."""
    line = one_line_error(result)
    assert line.startswith(f"error: Invalid value for '{option}'"), result.err
    assert line.endswith("--help`)"), line
    return line


# ---- 1. timeouts -----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1"])
@pytest.mark.parametrize("command", [["run", "create", "f", "--wait"], ["run", "result", "x"],
                                     ["run", "update", "x", "u"]])
def test_a_timeout_that_would_wait_for_ever_is_refused_before_connecting(
        runstream: Any, command: list[str], value: str) -> None:
    line = one_line_error(runstream(*command, "--timeout", value))
    assert "--timeout must be a finite number of seconds more than 0" in line


def test_a_drain_timeout_must_be_finite(
        runstream: Any, tmp_path: Path, no_worker: None) -> None:
    line = one_line_error(runstream("worker", "--app", APP, "--data-dir", str(tmp_path / "w"),
                                    "--drain-timeout", "nan"))
    assert "--drain-timeout" in line


def test_click_s_usage_errors_are_one_line_naming_the_help_to_read(runstream: Any) -> None:
    """Click prints three lines (usage, a hint, the error); every other error is one."""
    line = one_line_error(runstream("runs", "list", "--bogus"))
    assert line == "error: No such option '--bogus'. (see `runstream runs list --help`)"
    line = one_line_error(runstream("nosuch"))
    assert line == "error: No such command 'nosuch'. (see `runstream --help`)"
    line = one_line_error(runstream("run", "status"))
    assert "Missing argument" in line and line.endswith("(see `runstream run status --help`)")


# ---- 5. what used to end in a traceback ------------------------------------------------------


@pytest.mark.parametrize("bootstrap", [":", "host:notaport", "host:99999"])
def test_a_bootstrap_that_names_no_host_and_port_is_one_line(
        runstream: Any, bootstrap: str) -> None:
    line = one_line_error(runstream("run", "status", "x",
                                    env={"RUNSTREAM_BOOTSTRAP": bootstrap}))
    assert "RUNSTREAM_BOOTSTRAP" in line and "host:port" in line
    line = one_line_error(runstream("run", "status", "x", "--bootstrap", bootstrap))
    assert "host:port" in line


def test_an_empty_bootstrap_or_namespace_is_one_line_not_the_default(runstream: Any) -> None:
    """(`--namespace "$NS"` with NS unset read the default namespace's runs)"""
    for option, said in (("--namespace", "namespace ''"), ("--bootstrap", "empty address")):
        result = runstream("run", "status", "r1", option, "")
        assert result.code == 2 and said in result.err, result
        assert len(result.err.strip().splitlines()) == 1, result


def test_a_bootstrap_without_a_port_that_fails_says_why(runstream: Any) -> None:
    """Port 9092 is taken when none is given: the diagnosis of a failed connection said
    "invalid literal for int()" of the host name, for every such address."""
    result = runstream("run", "status", "x", "--bootstrap", "nosuchhost.invalid")
    assert result.code == 3 and result.err.count("\n") == 1, result  # (a broker error)
    assert "nosuchhost.invalid" in result.err and "int()" not in result.err, result


@pytest.mark.parametrize("args", [("--workers", "0"), ("--runs", "0"), ("--runs", "-5")])
def test_a_demo_of_no_workers_or_runs_is_a_usage_error(runstream: Any,
                                                      args: tuple[str, str]) -> None:
    """It hung with no worker, and reported -5 runs at -3790 runs/s before failing."""
    assert "x>=1" in one_line_error(runstream("demo", *args))


def test_a_bad_run_timeout_is_not_told_that_0_is_forever(runstream: Any) -> None:
    line = one_line_error(runstream("run", "create", "checkout", "--run-timeout", "10x"))
    assert "is not a duration" in line and "forever" not in line, line


@pytest.mark.parametrize("args", [
    ("topics", "create"), ("acl", "grant", "--role", "worker", "--principal", "User:w"),
    ("topics", "alter", "--journal-retention", "0")])
def test_no_broker_is_exit_3_for_the_admin_commands_as_for_every_other(
        runstream: Any, args: tuple[str, ...]) -> None:
    """Nothing listens at 127.0.0.1:1: these exited 2, a usage error's code."""
    result = runstream(*args)
    assert result.code == 3 and result.err.count("\n") == 1, result


@pytest.mark.parametrize("args", [("run", "status", "x"), ("topics", "create"),
                                  ("runs", "list")])
def test_a_namespace_no_topic_can_be_named_after_is_one_line(
        runstream: Any, args: tuple[str, ...]) -> None:
    """Kafka said InvalidTopicError, or a command advised `runstream topics create`."""
    line = one_line_error(runstream(*args, "--namespace", "orders eu"))
    assert "namespace 'orders eu'" in line and "A-Z a-z 0-9 . _ -" in line, line
    with pytest.raises(InvalidInput, match="namespace"):
        Client(namespace="orders/eu")


def test_tls_files_that_cannot_be_used_are_one_line(runstream: Any, tmp_path: Path) -> None:
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate\n")
    missing = str(tmp_path / "missing.pem")
    for options, flag in ((["--ssl-cafile", missing], "--ssl-cafile"),
                          (["--ssl-cafile", str(not_pem)], "--ssl-cafile"),
                          (["--ssl-certfile", missing], "--ssl-certfile")):
        line = one_line_error(runstream("--security-protocol", "SSL", *options,
                                        "run", "status", "x"))
        assert flag in line and "cannot be used for TLS" in line


def test_a_bad_log_level_is_one_line(
        runstream: Any, tmp_path: Path, no_worker: None) -> None:
    line = one_line_error(runstream("worker", "--app", APP, "--data-dir", str(tmp_path / "w"),
                                    "--log-level", "bogus"))
    assert "--log-level 'bogus' is not one of DEBUG, INFO" in line


def test_a_data_dir_that_cannot_be_a_directory_is_one_line(
        runstream: Any, tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    line = one_line_error(runstream("worker", "--app", APP, "--data-dir", str(a_file)))
    assert "is a file, not a directory" in line
    line = one_line_error(runstream("worker", "--app", APP, "--data-dir",
                                    str(a_file / "under")))
    assert "--data-dir" in line and "cannot be a directory" in line


def test_an_instance_id_kafka_would_refuse_is_one_line(runstream: Any, tmp_path: Path) -> None:
    for args, env in ((["--instance-id", "two words"], None),
                      ([], {"RUNSTREAM_INSTANCE_ID": "a/b"})):
        line = one_line_error(runstream("worker", "--app", APP, "--data-dir",
                                        str(tmp_path / "w"), *args, env=env))
        assert "an instance id is 1 to 249 of the characters" in line, line


@pytest.mark.parametrize("app", ["os:O_RDONLY", "json:dumps"])
def test_an_app_that_names_no_flows_is_one_line(
        runstream: Any, tmp_path: Path, app: str) -> None:
    line = one_line_error(runstream("worker", "--app", app, "--data-dir", str(tmp_path / "w")))
    assert "must be a Flow, a list of Flow objects" in line


def test_a_registry_url_that_is_no_url_is_one_line(runstream: Any) -> None:
    line = one_line_error(runstream("schemas", "register", "--registry", "notaurl"))
    assert "http:// or https://" in line


@pytest.mark.parametrize("command", [["schedule", "create", "s1", "f", "--every"],
                                     ["run", "create", "f", "--run-timeout"]])
def test_a_duration_too_long_for_a_timedelta_is_a_usage_error(
        runstream: Any, command: list[str]) -> None:
    last = click_error(runstream(*command, "99999999999999d"), command[-1])
    assert "too long a duration" in last


def test_the_backstop_turns_an_os_or_value_error_into_one_line(
        runstream: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(**security: str | None) -> None:
        raise FileNotFoundError(2, "No such file or directory", "/nowhere")

    monkeypatch.setattr("runstream.engine.cli.apply_security", broken)
    line = one_line_error(runstream("run", "status", "x"))
    assert line == ("error: FileNotFoundError: [Errno 2] No such file or directory: "
                    "'/nowhere'")


# ---- 3. a worker without execution slots -----------------------------------------------------


@pytest.mark.parametrize("concurrency", ["0", "-1"])
def test_a_worker_without_execution_slots_is_a_usage_error(
        runstream: Any, tmp_path: Path, concurrency: str, no_worker: None) -> None:
    click_error(runstream("worker", "--app", APP, "--data-dir", str(tmp_path / "w"),
                          "--concurrency", concurrency), "--concurrency")


# ---- 7. --json -------------------------------------------------------------------------------


def _command(*path: str) -> click.Command:
    command: click.Command = cli
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


@pytest.mark.parametrize("path", [("broker", "status"), ("topics", "create"),
                                  ("projection", "rebuild"), ("run", "create"),
                                  ("run", "result")])
def test_every_command_that_prints_json_takes_json(path: tuple[str, ...]) -> None:
    options = {opt for param in _command(*path).params for opt in getattr(param, "opts", [])}
    assert "--json" in options


@pytest.mark.parametrize("command", [["run", "create", "f"], ["run", "result", "x"]])
def test_run_create_and_result_take_json_as_what_they_print_anyway(
        runstream: Any, command: list[str]) -> None:
    result = runstream(*command, "--json")
    assert result.code == 3, result  # past the options: nothing listens at 127.0.0.1:1
    assert "No such option" not in result.err


def test_broker_status_json(runstream: Any, tmp_path: Path) -> None:
    result = runstream("broker", "status", "--data-dir", str(tmp_path / "broker"), "--json")
    status = json.loads(result.out)
    assert {"bootstrap", "data_dir", "ok", "nodes"} <= status.keys()
    assert result.code == (0 if status["ok"] else 1)
    assert {"node", "address", "running", "answering", "log"} <= status["nodes"][0].keys()


def test_topics_create_json(runstream: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    async def ensure(bootstrap: str, namespace: str, *args: Any, **kwargs: Any) -> TopicReport:
        journal = TopicResult(f"{namespace}.journal", created=True, partitions=3,
                              replication_factor=1, configs={"retention.ms": "-1"})
        return TopicReport(bootstrap, namespace, (journal,))

    monkeypatch.setattr(topics_cli, "ensure_topics", ensure)
    result = runstream("topics", "create", "--namespace", "ns", "--json")
    assert result.code == 0, result
    report = json.loads(result.out)
    assert report["ok"] is True and report["namespace"] == "ns"
    assert report["topics"][0] == {"name": "ns.journal", "created": True, "partitions": 3,
                                   "replication_factor": 1,
                                   "configs": {"retention.ms": "-1"}, "mismatches": []}
    assert report["requests_topics"] == []


def test_projection_rebuild_json(runstream: Any, monkeypatch: pytest.MonkeyPatch,
                                 tmp_path: Path) -> None:
    async def rebuild(**kwargs: Any) -> RebuildReport:
        return RebuildReport(records=7, partitions={1: 5, 0: 2},
                             differences=[Difference(b"\x01k", b"a", None)], compared_keys=9)

    monkeypatch.setattr(projection_cli.integrity, "rebuild", rebuild)
    result = runstream("projection", "rebuild", "--data-dir", str(tmp_path), "--verify-only",
                       "--json")
    assert result.code == 1, result  # (it differs: as `projection verify`)
    assert json.loads(result.out) == {
        "records": 7, "replaced": False, "partitions": {"0": 2, "1": 5},
        "compared_keys": 9, "identical": False, "differences": 1,
        "differences_capped": False, "differing_keys": ["016b"]}


DEEP = "[" * 5000 + "]" * 5000


@pytest.mark.parametrize(("args", "message"), [
    (["run", "signal", "r1", "go", "--start", "f", "--start-payload", "{bad"],
     "--start-payload is not valid JSON"),
    (["run", "create", "f", "--payload", DEEP], "--payload is nested too deeply"),
    (["run", "create", "f", "--attributes", '{"a": ' + DEEP + "}"],
     "--attributes: the attributes are nested too deeply"),
    (["run", "create", "f", "--attributes", '{"d": {"$time": "0001-01-01T00:00:00+14:00"}}'],
     "outside the years 1 to 9999 UTC"),
    # (these said RecursionError and Python's words)
    (["schedule", "create", "s", "f", "--every", "1h", "--payload", DEEP],
     "--payload is nested too deeply"),
    (["runs", "signal", "go", "--where", "a = 1", "--yes", "--payload", DEEP],
     "--payload is nested too deeply"),
    (["run", "resume", "r1", "--resolution", "skip", "--position", "0", "--digest", "d",
      "--result", DEEP], "--result is nested too deeply"),
    # (an empty id stood for none: a retry meant to be deduplicated applied twice)
    (["run", "signal", "r1", "go", "--request-id", ""], "request id must not be empty"),
])
def test_json_and_values_no_run_may_have_are_one_line_naming_their_option(
        runstream: Any, args: list[str], message: str) -> None:
    assert message in one_line_error(runstream(*args))


@pytest.mark.parametrize("position", ["-3", "99999999999999999999999"])
def test_a_resolution_s_position_is_a_32_bit_whole_number_at_the_cli(
        runstream: Any, position: str) -> None:
    """A negative one was sent (and refused as "a stale resolution?"), a huge one got the
    encoder's words."""
    last = click_error(runstream("run", "resume", "r1", "--resolution", "skip", "--position",
                                 position, "--digest", "d", "--result", "1"), "--position")
    assert "0<=x<=2147483647" in last, last


def test_a_run_timeout_over_a_century_is_a_usage_error(runstream: Any) -> None:
    last = click_error(runstream("run", "create", "f", "--run-timeout", "3000000d"),
                       "--run-timeout")
    assert "at most 100 years, not 3,000,000 days" in last and "timedelta" not in last


@pytest.mark.parametrize("given", ["0.5ms", "0s"])
def test_a_run_timeout_below_one_ms_is_a_usage_error_in_the_words_given(
        runstream: Any, given: str) -> None:
    """It said "not datetime.timedelta(microseconds=500)" (found by a probe)."""
    last = click_error(runstream("run", "create", "f", "--run-timeout", given),
                       "--run-timeout")
    assert f"must be more than 0 (1ms at least), not {given!r}" in last, last


def test_a_session_timeout_below_one_ms_is_a_usage_error(
        runstream: Any, tmp_path: Path) -> None:
    result = runstream("worker", "--app", APP, "--data-dir", str(tmp_path / "w"),
                       "--session-timeout-ms", "-5")
    assert "--session-timeout-ms" in click_error(result, "--session-timeout-ms")


@pytest.mark.parametrize("extra", [["--at", "garbage"], ["--as", "copy"], ["--force"]])
def test_a_dry_run_refuses_the_options_of_a_fork_it_does_not_make(
        runstream: Any, extra: list[str]) -> None:
    """They were ignored: `--at garbage` exited 0 with a report on the whole run."""
    line = one_line_error(runstream("run", "fork", "x", "--dry-run", *extra))
    assert f"{extra[0]} does not go with it" in line


@pytest.mark.parametrize(("args", "said"), [
    (["runs", "cancel", "--where", "   "], "a batch needs a query (--where)"),
    (["runs", "cancel", "--where", ""], "a batch needs a query (--where)"),
    (["runs", "signal", "bad/name", "--where", "grp = 'qa1'"], "signal name 'bad/name'"),
    (["runs", "signal", "go", "--payload", "NaN", "--where", "grp = 'qa1'"], "NaN"),
    (["runs", "cancel", "--reason", "r" * 5000, "--where", "grp = 'qa1'"],
     "a cancel's reason is 5000 characters"),
    (["runs", "resume", "--where", "grp = "], "expected a value"),
])
def test_a_batch_is_checked_before_a_confirmation_is_asked(runstream: Any, args: list[str],
                                                          said: str) -> None:
    """Asked to confirm first, the operator was asked about every run of the namespace (a
    blank query) or about a batch refused once confirmed. Refused before connecting now:
    the bootstrap here answers nothing, and no confirmation is read."""
    line = one_line_error(runstream(*args))
    assert said in line, line
