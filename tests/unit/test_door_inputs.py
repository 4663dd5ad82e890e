"""Input refused at the library's doors, before anything is sent or waited on: timeouts that
would wait for ever (NaN, infinity, 0, negative), an empty run id, a worker without
execution slots, payloads JSON cannot carry, run timeouts that are no duration, free text
UTF-8 cannot encode, a schedule without a cadence, bootstrap addresses, TLS files and
registry URLs that are unusable, an `--app` naming no flows; and a dry run against code
without the run's flow is the caller's error (HTTP 400), not the UI's (500).

No broker: the client's bootstrap is 127.0.0.1:1 and the calls that would send are stubbed
to fail the test if reached."""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from pydantic import BaseModel

from runstream.engine.client.client import Client
from runstream.engine.client.handle import RunHandle
from runstream.engine.config import parse_duration, resolve_bootstrap, resolve_namespace
from runstream.engine.errors import InvalidInput, PayloadInvalid, SettingInvalid
from runstream.engine.flow.apps import AppNotFound, load_flows
from runstream.engine.flow.definition import Flow, PayloadNotJson, RetryPolicy, dump_json
from runstream.engine.journal.input_limits import check_text
from runstream.engine.kafka.confluent_registry import (
    SchemaRegistrationError,
    UrllibTransport,
    register_schemas,
    schema_by_id,
)
from runstream.engine.kafka.connection import KafkaSecurity, kafka_options
from runstream.engine.timetravel.dryrun import FlowNotInApp
from runstream.engine.ui import UiSettings, create_app
from runstream.engine.ui import app as uiapp
from runstream.engine.worker import Worker
from runstream.engine.worker.admission import Admission
from tests.unit.fixture_stores import StoreModel, fixture_store
from tests.unit.test_replay_fixtures import JOURNALS

NEVER = [math.nan, math.inf, -math.inf, 0, 0.0, -1, True]
GUARD_S = 5.0  # a call the old code let wait for ever fails the test after this


class Sent(AssertionError):
    """A call reached the point of producing a record."""


class Checkout(BaseModel):
    order_id: str
    amount: float


checkout = Flow("checkout", payload=Checkout)


@pytest.fixture
def client(tmp_path: Path) -> Client:
    made = Client(bootstrap_servers="127.0.0.1:1", flows=[checkout],
                  read_model_dir=tmp_path / "rm")

    async def refuse(*args: Any, **kwargs: Any) -> Any:
        raise Sent("the call was sent")

    made._place = refuse  # type: ignore[method-assign]
    made._request = refuse  # type: ignore[method-assign]
    return made


async def _refused(call: Callable[[], Awaitable[Any]]) -> InvalidInput:
    """The InvalidInput `call` raises at once: not a wait, not a send."""
    with pytest.raises(InvalidInput) as refused:
        await asyncio.wait_for(call(), GUARD_S)
    return refused.value


# ---- 1. timeouts that would wait for ever ---------------------------------------------------


@pytest.mark.parametrize("timeout", NEVER)
async def test_a_handles_wait_refuses_a_timeout_that_is_not_finite_and_positive(
        client: Client, timeout: float) -> None:
    handle = RunHandle(client, run_id="r", flow=None, partition=0, request_offset=0,
                       request_id=None)

    async def never(follow: bool) -> Any:
        await asyncio.sleep(3600)

    handle._result = never  # type: ignore[method-assign]
    refused = await _refused(lambda: handle.result(timeout=timeout))
    assert "timeout" in str(refused) and repr(timeout) in str(refused)
    await _refused(lambda: handle.admitted(timeout=timeout))


@pytest.mark.parametrize("timeout", NEVER)
async def test_an_update_with_a_timeout_that_is_not_finite_and_positive_is_never_sent(
        client: Client, timeout: float) -> None:
    refused = await _refused(lambda: client.update("r", "approve", {}, timeout=timeout))
    assert "timeout" in str(refused)


async def test_finite_positive_timeouts_still_time_out(client: Client) -> None:
    handle = RunHandle(client, run_id="r", flow=None, partition=0, request_offset=0,
                       request_id=None)

    async def never(follow: bool) -> Any:
        await asyncio.sleep(3600)

    handle._result = never  # type: ignore[method-assign]
    with pytest.raises(TimeoutError):
        await handle.result(timeout=0.05)


# ---- 2. an empty run id ---------------------------------------------------------------------


async def test_create_run_refuses_an_empty_run_id_and_only_none_generates_one(
        client: Client) -> None:
    payload = {"order_id": "o", "amount": 1}
    refused = await _refused(lambda: client.create_run(checkout, payload, run_id=""))
    assert "non-empty" in str(refused)
    with pytest.raises(Sent):  # None: a generated id, and the request goes out
        await client.create_run(checkout, payload, run_id=None)


# ---- 3. a worker without execution slots ----------------------------------------------------


@pytest.mark.parametrize("slots", [0, -1, True, 1.5])
def test_a_worker_without_an_execution_slot_is_refused_when_built(
        tmp_path: Path, slots: Any) -> None:
    with pytest.raises(InvalidInput, match="concurrency"):
        Admission(slots)
    with pytest.raises(InvalidInput, match="concurrency"):
        Worker(flows=[checkout], data_dir=tmp_path / "w", bootstrap_servers="127.0.0.1:1",
               concurrency=slots)


def test_a_worker_with_one_slot_is_built() -> None:
    assert Admission(1).free == 1


# ---- 4. payloads JSON cannot carry, retry intervals that are not numbers ---------------------


class Loose(BaseModel):
    note: Any = None


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_numbers_are_refused_typed_or_not(bad: float) -> None:
    for value in ({"x": bad}, [1, {"y": [bad]}], bad):
        with pytest.raises(PayloadInvalid, match="NaN or an infinity"):
            dump_json(value)  # untyped: pydantic would write null
    with pytest.raises(PayloadInvalid, match=r"flow 'checkout'.*NaN or an infinity"):
        checkout.dump_payload({"order_id": "o", "amount": bad})  # typed: bare NaN
    loose = Flow("loose", payload=Loose)
    with pytest.raises(PayloadInvalid, match="NaN or an infinity"):
        loose.dump_payload({"note": {"deep": bad}})  # an Any field of a model: null


def test_a_payload_json_cannot_hold_is_payload_not_json() -> None:
    """An object pydantic cannot write, or a value nested past its depth: a client sending
    it by flow name raised PydanticSerializationError, or a bare ValueError."""
    deep: list[Any] = []
    inner = deep
    for _ in range(5000):
        inner.append([])
        inner = inner[0]
    for value, why in ((object(), "Unable to serialize"), (deep, "depth")):
        with pytest.raises(PayloadNotJson, match=why):
            dump_json(value)


@pytest.mark.parametrize("run_id", [None, 123, ""])
async def test_a_query_of_what_is_no_run_id_is_invalid_input_before_connecting(
        run_id: Any) -> None:
    """It was an AttributeError, from the partition's hash (nothing listens at :1)."""
    client = Client(bootstrap_servers="127.0.0.1:1", namespace="no-broker")
    for query in (client.status, client.describe, client.journal):
        with pytest.raises(InvalidInput, match="run id"):
            await query(run_id)


def test_finite_values_and_nulls_are_written_as_before() -> None:
    assert dump_json({"b": None, "a": [1.5, None]}) == '{"a":[1.5,null],"b":null}'
    assert checkout.dump_payload({"order_id": "o", "amount": 2}) == \
        '{"amount":2.0,"order_id":"o"}'
    assert Flow("loose", payload=Loose).dump_payload({"note": None}) == '{"note":null}'


async def test_a_payload_with_nan_is_never_sent(client: Client) -> None:
    refused = await _refused(lambda: client.create_run("free", {"x": math.nan}))
    assert isinstance(refused, PayloadInvalid)
    await _refused(lambda: client.create_run(checkout, {"order_id": "o",
                                                        "amount": math.inf}))
    await _refused(lambda: client.signal("r", "go", {"x": math.nan}))


@pytest.mark.parametrize("field", ["initial_interval", "backoff_coefficient",
                                   "maximum_interval"])
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_retry_policy_takes_finite_numbers_only(field: str, bad: float) -> None:
    with pytest.raises(ValueError, match=f"{field}.*finite"):
        RetryPolicy(**{field: bad})


@pytest.mark.parametrize("fields", [{"initial_interval": 1e17},
                                    {"maximum_interval": 1e12}])
def test_a_retry_interval_the_journal_cannot_hold_is_refused(fields: dict[str, float]) -> None:
    # (its delay, journaled in ms, did not fit: the run failed with EncodeError)
    with pytest.raises(ValueError, match="ten years"):
        RetryPolicy(**fields)
    assert RetryPolicy(initial_interval=3600, maximum_interval=86400 * 365).maximum_interval


# ---- 8. small gaps: run_timeout, reasons and request ids, schedules --------------------------


@pytest.mark.parametrize("run_timeout", [math.nan, math.inf, 1e30, True, "99999999999999d"])
async def test_a_run_timeout_that_is_no_duration_is_refused_clearly(
        client: Client, run_timeout: Any) -> None:
    refused = await _refused(lambda: client.create_run(
        checkout, {"order_id": "o", "amount": 1}, run_timeout=run_timeout))
    assert str(refused).startswith("run_timeout") and isinstance(refused, ValueError)


def test_huge_durations_are_one_value_error() -> None:
    with pytest.raises(ValueError, match="too long a duration"):
        parse_duration("99999999999999d")
    with pytest.raises(ValueError, match="timeout"):
        Flow("slow", timeout=math.inf)


async def test_a_cancel_reason_must_be_text(client: Client) -> None:
    refused = await _refused(lambda: client.cancel("r", reason=None))  # type: ignore[arg-type]
    assert "must be a string" in str(refused)


async def test_lone_surrogates_in_free_text_are_refused_before_sending(client: Client) -> None:
    with pytest.raises(InvalidInput, match="lone surrogate"):
        check_text("a cancel's reason", "why \udcff")
    assert check_text("a cancel's reason", "naïve ✓") == "naïve ✓"
    await _refused(lambda: client.cancel("r", reason="\udcff"))
    await _refused(lambda: client.signal("r", "go", request_id="\ud800"))
    await _refused(lambda: client.update("r", "approve", request_id="\ud800"))


async def test_a_schedule_with_neither_cron_nor_every_is_never_sent(client: Client) -> None:
    refused = await _refused(lambda: client.create_schedule("s", "f"))
    assert "cron" in str(refused) and "every" in str(refused)


def test_the_catchup_window_docstring_says_what_a_short_window_does() -> None:
    assert "under 10 s counts as 10 s" in " ".join((Client.create_schedule.__doc__ or "").split())


# ---- 5. bootstrap addresses, TLS files, registry URLs, apps ---------------------------------


@pytest.mark.parametrize("bad", [":", "host:notaport", "host:0", "host:99999", ":9092",
                                 "a:1,,b:2", "[::1", "[::1]x"])
def test_a_bootstrap_address_that_names_no_host_and_port_is_one_line(
        monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    with pytest.raises(InvalidInput, match="host:port"):
        resolve_bootstrap(bad)
    monkeypatch.setenv("RUNSTREAM_BOOTSTRAP", bad)
    with pytest.raises(SettingInvalid, match="RUNSTREAM_BOOTSTRAP"):
        resolve_bootstrap()


def test_an_empty_bootstrap_or_namespace_given_is_refused_not_the_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`--bootstrap ''` and `--namespace ''` (a variable that expanded to nothing) went to
    the default broker and namespace; an empty variable is still "not set"."""
    with pytest.raises(InvalidInput, match="empty address"):
        resolve_bootstrap("")
    with pytest.raises(InvalidInput, match="namespace ''"):
        resolve_namespace("")
    monkeypatch.setenv("RUNSTREAM_BOOTSTRAP", "")
    monkeypatch.setenv("RUNSTREAM_NAMESPACE", "")
    assert (resolve_bootstrap(), resolve_namespace()) == ("127.0.0.1:9092", "runstream")


@pytest.mark.parametrize("good", ["127.0.0.1:9092", "a:1, b:65535", "broker", "::1",
                                  "[::1]:9092", "[fe80::1]"])
def test_bootstrap_addresses_the_kafka_client_takes_still_pass(good: str) -> None:
    assert resolve_bootstrap(good) == good


def test_tls_files_that_cannot_be_used_are_one_line(tmp_path: Path) -> None:
    missing, not_pem = str(tmp_path / "missing.pem"), tmp_path / "not.pem"
    not_pem.write_text("not a certificate\n")
    for settings, flag in ((KafkaSecurity("SSL", ssl_cafile=missing), "--ssl-cafile"),
                           (KafkaSecurity("SSL", ssl_cafile=str(not_pem)), "--ssl-cafile"),
                           (KafkaSecurity("SSL", ssl_certfile=missing), "--ssl-certfile")):
        with pytest.raises(InvalidInput, match=flag):
            kafka_options(settings)


def test_a_registry_url_that_is_no_http_url_is_one_line() -> None:
    with pytest.raises(SchemaRegistrationError, match="http:// or https://"):
        register_schemas("notaurl")
    with pytest.raises(SchemaRegistrationError):
        UrllibTransport("notaurl")(schema_by_id(1))


@pytest.mark.parametrize("app", ["os:O_RDONLY", "json:dumps", "os:getpid", "os:sep",
                                 "os:environ"])
def test_an_app_that_names_no_flows_is_one_line(app: str) -> None:
    with pytest.raises(AppNotFound, match="must be a Flow, a list of Flow objects"):
        load_flows(app)


@pytest.mark.parametrize(("source", "said"), [
    ("def (:\n", "SyntaxError: invalid syntax (broken_app.py, line 1)"),
    ("x = 1\nraise RuntimeError('boom')\n", "RuntimeError: boom (at "),
    ("import json\njson.loads('{')\n", "broken_app.py, line 2)"),  # (not json's own line)
])
def test_an_app_whose_module_fails_to_import_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, said: str) -> None:
    """A syntax error or the module's own failure printed a 50-line traceback."""
    (tmp_path / "broken_app.py").write_text(source)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(AppNotFound, match="cannot import 'broken_app' for --app") as refused:
        load_flows("broken_app:flows")
    assert said in str(refused.value) and "\n" not in str(refused.value)
    sys.modules.pop("broken_app", None)


def test_an_app_naming_flows_still_loads() -> None:
    assert {f.name for f in load_flows("tests.ui.flows:flows")} >= {"order", "nap"}


# ---- 6. a dry run against code without the run's flow --------------------------------------


async def test_the_ui_answers_a_dry_run_of_a_flow_the_app_lacks_with_400(tmp_path: Path) -> None:
    assert issubclass(FlowNotInApp, InvalidInput)
    store, partitions = fixture_store(JOURNALS / "updates.jsonl", tmp_path / "store")
    app = create_app(UiSettings(bootstrap="127.0.0.1:1", namespace="ns",
                                app="tests.ui.flows:flows"))
    app[uiapp.MODEL] = StoreModel(store, partitions)  # type: ignore[assignment]
    async with TestClient(TestServer(app)) as http:
        answer = await http.get("/run/dry-run?id=u")
        body = await answer.text()
    store.close()
    assert answer.status == 400, body
    assert "does not define" in body
