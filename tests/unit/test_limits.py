"""Input limits (engine.journal.input_limits) and the relay's judgement of what it
forwards (engine.worker.relay):
pure functions, no broker."""

from __future__ import annotations

import dataclasses
import json

import pytest

from runstream.engine.errors import InvalidInput, InvalidRunId, PayloadInvalid
from runstream.engine.journal import decode, encode
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import (
    MAX_ADDRESSED_RUN_ID_CHARS,
    MAX_NAME_CHARS,
    MAX_RECORD_BYTES,
    MAX_RUN_ID_CHARS,
    NameInvalid,
    PayloadTooLarge,
    RecordTooLarge,
    RunIdInvalid,
    check_authority_name,
    check_name,
    check_payload,
    check_run_id,
    encode_request,
    max_payload_bytes,
)
from runstream.engine.journal.records import lineage_of
from runstream.engine.worker.relay_judge import (
    AUTHORITY_HEADER,
    Forward,
    Incoming,
    Refuse,
    judge,
    load_authorities,
)
from runstream.projections.fork_plan import fork_run_id
from runstream.projections.partitioning import run_partition
from tests.builders import Writer, from_a_newer_runstream, request

NS = "ns"
PARTITIONS = 4


@pytest.mark.parametrize("run_id", [
    "order-1042", "a" * MAX_RUN_ID_CHARS, "9f86d081884c7d659a2feaa0c55ad015",
    "tenant:acme/order@2024+x=y_z.1",
])
def test_new_run_ids_that_are_valid(run_id: str) -> None:
    assert check_run_id(run_id, new=True) == run_id


@pytest.mark.parametrize("run_id", [
    "parent.3", "parent.3.7.12",  # children: <parent>.<position>, per level
    "lineage~2", "lineage~2.4",  # rounds, and a round's child
    "src-round-2-fork-0a1b2c3d",  # a generated fork id
    "p" + ".123456" * 64 + "~999",  # 64 levels of children, then rounds
])
def test_ids_the_engine_derives_are_valid_addresses(run_id: str) -> None:
    assert len(run_id) <= MAX_ADDRESSED_RUN_ID_CHARS
    assert check_run_id(run_id) == run_id


@pytest.mark.parametrize("run_id, fragment", [
    ("", "non-empty"),
    ("has space", "' '"),
    ("tab\there", "'\\t'"),
    ("nul\x00", "'\\x00'"),
    ("newline\n", "'\\n'"),
    ("ünïcode", "'ï'"),
    ("a" * (MAX_RUN_ID_CHARS + 1), f"over the {MAX_RUN_ID_CHARS}"),
    ("lineage~1", "names the rounds"),
])
def test_new_run_ids_that_are_refused(run_id: str, fragment: str) -> None:
    with pytest.raises(RunIdInvalid) as refused:
        check_run_id(run_id, new=True)
    assert fragment in str(refused.value)
    assert isinstance(refused.value, InvalidInput) and isinstance(refused.value, InvalidRunId)
    assert "\n" not in str(refused.value)  # one line, even for a hostile id


def test_an_addressed_id_may_be_longer_but_not_unbounded() -> None:
    check_run_id("a" * MAX_ADDRESSED_RUN_ID_CHARS)
    with pytest.raises(RunIdInvalid, match="over the 1024"):
        check_run_id("a" * (MAX_ADDRESSED_RUN_ID_CHARS + 1))
    with pytest.raises(RunIdInvalid, match=r"\.\.\. \(1000000 chars\)"):
        check_run_id(" " * 1_000_000)  # the message shows a cut of it, not all of it


def test_generated_fork_ids_stay_valid_however_long_the_source() -> None:
    source = "s" * MAX_RUN_ID_CHARS
    fork = fork_run_id(source, None)
    assert check_run_id(fork, new=True) == fork and fork.startswith("s" * 100)
    again = fork_run_id(fork, None)
    assert check_run_id(again, new=True) == again and again != fork
    assert fork_run_id("lineage~3", None).startswith("lineage-round-3-fork-")
    with pytest.raises(RunIdInvalid, match="names the rounds"):
        fork_run_id("x", "y~1")


@pytest.mark.parametrize("name", ["approval", "order.paid", "ns:event-1", "x" * MAX_NAME_CHARS])
def test_names_that_are_valid(name: str) -> None:
    assert check_name("signal", name) == name


@pytest.mark.parametrize("name, fragment", [
    ("", "non-empty"), ("with space", "' '"), ("slash/", "'/'"), ("tilde~", "'~'"),
    ("x" * (MAX_NAME_CHARS + 1), f"over the {MAX_NAME_CHARS}"),
])
def test_names_that_are_refused(name: str, fragment: str) -> None:
    with pytest.raises(NameInvalid) as refused:
        check_name("flow", name)
    assert fragment in str(refused.value) and "flow name" in str(refused.value)


def test_authority_names_end_a_topic_name() -> None:
    assert check_authority_name("team-a_1") == "team-a_1"
    for bad in ("", "a.b", "a b", "x" * 101):
        with pytest.raises(NameInvalid):
            check_authority_name(bad)


def test_payload_limit_counts_encoded_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNSTREAM_MAX_PAYLOAD_BYTES", "10")
    assert max_payload_bytes() == 10
    check_payload("p", '"12345678"')
    with pytest.raises(PayloadTooLarge) as refused:
        check_payload("the payload of flow 'f'", '"ééééé"')  # 7 characters, 12 bytes
    assert refused.value.size == 12 and refused.value.limit == 10
    assert isinstance(refused.value, PayloadInvalid)  # what callers caught before
    assert "over the 10-byte limit (RUNSTREAM_MAX_PAYLOAD_BYTES)" in str(refused.value)


def test_payload_limit_default_and_bad_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RUNSTREAM_MAX_PAYLOAD_BYTES", raising=False)
    assert max_payload_bytes() == 512 * 1024
    for bad in ("lots", "0", str(MAX_RECORD_BYTES + 1)):
        monkeypatch.setenv("RUNSTREAM_MAX_PAYLOAD_BYTES", bad)
        with pytest.raises(InvalidInput, match="RUNSTREAM_MAX_PAYLOAD_BYTES"):
            max_payload_bytes()


def test_no_request_over_the_record_limit_is_encoded() -> None:
    small = create("r1", "q1")
    value, headers = encode_request(small, b"r1", [("traceparent", b"00-ab")])
    assert decode(value) == small and ("traceparent", b"00-ab") in headers
    big = create("r1", "q1", payload_json=json.dumps("x" * MAX_RECORD_BYTES))
    with pytest.raises(RecordTooLarge, match=f"over the {MAX_RECORD_BYTES}-byte limit"):
        encode_request(big, b"r1")


def create(run_id: str, request_id: str, **body: object) -> ev.RunCreateRequested:
    fields: dict[str, object] = {"flow": "checkout", "payload_json": '{"amount":5}', **body}
    record: ev.RunCreateRequested = request(ev.RunCreateRequested, run_id=run_id,
                                            request_id=request_id, **fields)
    return record


# ---- the relay's judgement ----------------------------------------------------------------

def _incoming(record: object, *, topic: str = f"{NS}.requests", key: bytes | None = None,
              partition: int | None = None) -> Incoming:
    value, headers = encode(record)  # type: ignore[arg-type]
    run_id = record.envelope.run_id  # type: ignore[attr-defined]
    return Incoming(topic, run_partition(run_id, PARTITIONS) if partition is None else partition,
                    7, run_id.encode() if key is None else key, value, tuple(headers))


def _judge(incoming: Incoming, authorities: dict[str, frozenset[str]] | None = None
           ) -> Forward | Refuse:
    return judge(incoming, NS, authorities or {}, PARTITIONS)


def test_client_requests_are_forwarded_unchanged() -> None:
    for record in (create("r1", "q1"),
                   request(ev.RunSignalSent, run_id="r1", request_id="q2", name="go"),
                   _in_lineage(request(ev.RunCancelRequested, run_id="r1~2", request_id="q3")),
                   request(ev.RunResumeRequested, run_id="r1", request_id="q4", operator="me")):
        incoming = _incoming(record, key=b"r1")
        verdict = _judge(incoming)
        assert isinstance(verdict, Forward), verdict
        assert verdict.value == incoming.value and verdict.headers == list(incoming.headers)


def test_decisions_and_owner_requests_are_refused() -> None:
    owner = Writer("zombie")
    claim = owner.claim(0, generation=99)
    completed = owner.decide(ev.StepCompleted, run_id="r1", position=0, name="charge",
                             result_json="1")
    wake = request(ev.RunWakeRequested, run_id="r1", request_id="w", child_run_id="r1.0",
                   child_status="completed", result_json='"forged"', position=0)
    child = create("r1.0", "c", parent_run_id="r1", parent_lineage_id="r1", parent_position=0)
    assert "not a request: partition.epoch-claimed is a decision" in _reason(
        _incoming(claim, key=b"", partition=0))
    assert "not a request: step.completed" in _reason(_incoming(completed))
    assert "not a client request: this run.wake-requested" in _reason(_incoming(wake))
    assert "not a client request: this run.create-requested" in _reason(_incoming(child))


def test_garbage_bad_keys_and_ids_are_refused() -> None:
    garbage = Incoming(f"{NS}.requests", 0, 1, b"k", b"\x00\x00\x00\x00\x01junk", ())
    assert _reason(garbage).startswith("decode error:")
    assert "newer runstream" not in _reason(garbage)
    value, headers = from_a_newer_runstream(create("r1", "q1"))
    newer = dataclasses.replace(  # (a newer client's request type, under a newer schema id)
        _incoming(create("r1", "q1"), key=b"r1"), value=value, headers=tuple(headers))
    assert _reason(newer).endswith(
        "(a run.something-newer request of a newer runstream: upgrade the workers)")
    assert _reason(Incoming(f"{NS}.requests", 0, 1, b"k", None, ())).startswith("not a request")
    record = create("r1", "q1")
    assert "wrong key" in _reason(_incoming(record, key=b"other"))
    wrong = (run_partition("r1", PARTITIONS) + 1) % PARTITIONS
    assert "wrong partition" in _reason(_incoming(record, partition=wrong))
    assert "no request_id" in _reason(_incoming(create("r1", "")))
    assert "invalid input" in _reason(_incoming(create("bad id", "q1")))


def test_a_restricted_authority_gets_its_ceiling_narrowed() -> None:
    caps = {"team": frozenset({"email"})}
    topic = f"{NS}.requests.team"
    for declared, expected in ((None, ["email"]), (["email", "payments"], ["email"]),
                               (["payments"], [])):
        verdict = _judge(_incoming(create("r1", "q1", ceiling=declared), topic=topic), caps)
        assert isinstance(verdict, Forward)
        forwarded = decode(verdict.value)
        assert isinstance(forwarded, ev.RunCreateRequested) and forwarded.ceiling == expected
        assert (AUTHORITY_HEADER, b"team") in verdict.headers
    signal = request(ev.RunSignalSent, run_id="r1", request_id="s", name="go")
    resume = request(ev.RunResumeRequested, run_id="r1", request_id="s", operator="x")
    for asked in (signal, resume):  # they carry the authority, for the reducer to check
        verdict = _judge(_incoming(asked, topic=topic), caps)
        assert isinstance(verdict, Forward)
        carried = decode(verdict.value)
        assert isinstance(carried, ev.RunSignalSent | ev.RunResumeRequested)
        assert (carried.authority, carried.authority_capabilities) == ("team", ["email"])
        if isinstance(carried, ev.RunResumeRequested):  # (who asked: what the client said,
            assert carried.operator == "authority team: x"  # behind the authority)
    cancel = request(ev.RunCancelRequested, run_id="r1", request_id="c", reason="r",
                     requested_by="admin@ops")
    forwarded = _judge(_incoming(cancel, topic=topic), caps)
    assert isinstance(forwarded, Forward)
    assert decode(forwarded.value).requested_by == "authority team: admin@ops"  # type: ignore[attr-defined]
    skip = dataclasses.replace(resume, resolution="skip", position=0, digest="d",
                               result_json="1")
    assert "operator's request" in _reason(_incoming(skip, topic=topic), caps)
    assert "authority 'other' is not configured" in _reason(
        _incoming(create("r1", "q1"), topic=f"{NS}.requests.other"), caps)


def test_a_restricted_authority_may_not_take_a_schedule_s_fire_ids() -> None:
    # (a fire whose predictable id a client took first made no run: every instant taken so
    # was lost to the operator's schedule)
    caps, topic = {"team": frozenset({"email"})}, f"{NS}.requests.team"
    for run_id in ("nightly@2026-12-06T12:14:00.000Z", "nightly@trigger/r-1"):
        key = lineage_of(run_id).encode()
        assert "shape of a schedule's fired run" in _reason(
            _incoming(create(run_id, "q1"), topic=topic, key=key), caps)
        started = request(ev.RunSignalWithStartRequested, run_id=run_id, request_id="q2",
                          signal_name="go", flow="f", payload_json="null")
        assert "shape of a schedule's fired run" in _reason(
            _incoming(started, topic=topic, key=key), caps)
        # an operator's (the unrestricted topic) is forwarded: its runs are its own
        assert isinstance(_judge(_incoming(create(run_id, "q1"), key=key)), Forward)
    for run_id in ("order@home", "me@2026-12-06", "a@b@2026-12-06T12:14:00.000"):
        verdict = _judge(_incoming(create(run_id, "q1"), topic=topic,
                                   key=lineage_of(run_id).encode()), caps)
        assert isinstance(verdict, Forward), (run_id, verdict)


def test_a_restricted_authority_may_not_take_a_child_s_id_a_fork_s_or_an_owner_s_request_id(
) -> None:
    """Each reached a run the authority does not cover (found by a probe): a child id taken
    first failed its parent's spawn; a fork's new run under a fire id cost the schedule that
    instant; a request id an owner gives its own (fire/, spawn/, ...) spent first on the
    partition made the owner's a duplicate, and the fire, spawn or wake never happened."""
    caps, topic = {"team": frozenset({"email"})}, f"{NS}.requests.team"
    child = "order-7@12.1"
    assert "shape of a child run's" in _reason(
        _incoming(create(child, "q1"), topic=topic, key=child.encode()), caps)
    fork = request(ev.RunForkRequested, run_id="mine", request_id="f1", source_run_id="mine",
                   source_offset=3, source_record=2, target_run_id="nightly@trigger/r-9",
                   parts=1)
    assert "shape of a schedule's fired run" in _reason(
        _incoming(fork, topic=topic, key=b"mine"), caps)
    for spent in ("fire/nightly@2026-12-06T12:14:00.000Z", "spawn/par@4/1", "wake/x@1"):
        signal = request(ev.RunSignalSent, run_id="mine", request_id=spent, name="go",
                         payload_json="null")
        assert "starts as the ids the engine gives its own requests" in _reason(
            _incoming(signal, topic=topic, key=b"mine"), caps)
        # (an operator's, on the unrestricted topic, is its own affair)
        assert isinstance(_judge(_incoming(signal, key=b"mine")), Forward)


def test_a_restricted_schedule_change_naming_no_ceiling_keeps_the_schedule_s() -> None:
    """Narrowed to the sending authority's capabilities, another authority's note widened
    the schedule's ceiling and locked out the one that made it (found by a probe); a
    create, or a change that names a ceiling, is narrowed as before."""
    from runstream.engine.journal.records import request_envelope

    caps = {"team": frozenset({"email"}), "other": frozenset({"email", "payments"})}

    def change(action: str, ceiling: list[str] | None) -> Forward:
        asked = ev.ScheduleChangeRequested(
            envelope=request_envelope(ev.ScheduleChangeRequested.TYPE, "", request_id="c1",
                                      now_ms=0, lineage_id="s1"),
            schedule_id="s1", action=action, flow="f", every_ms=60_000, note="a note",
            ceiling=ceiling)
        verdict = _judge(_incoming(asked, topic=f"{NS}.requests.other", key=b"s1"), caps)
        assert isinstance(verdict, Forward), verdict
        return verdict

    for action, asked, carried in (("update", None, None), ("pause", None, None),
                                   ("create", None, ["email", "payments"]),
                                   ("update", ["email", "sms"], ["email"])):
        record = decode(change(action, asked).value)
        assert isinstance(record, ev.ScheduleChangeRequested)
        assert (record.ceiling, record.authority) == (carried, "other"), action


def test_a_restricted_request_the_authority_s_fields_take_past_the_limit_is_refused() -> None:
    """A signal at the size limit grew by the authority's fields past it: forwarded, the
    journal dead-lettered it as oversize, and the relay counted it forwarded (found by a
    probe). It is refused with its reason; sent by an operator it is forwarded as is."""
    from runstream.engine.journal import MAX_RECORD_BYTES

    caps = {"team": frozenset({f"capability-{n}" for n in range(40)})}
    base = request(ev.RunSignalSent, run_id="r1", request_id="s1", name="go",
                   payload_json='""')
    room = MAX_RECORD_BYTES - len(encode(base)[0]) - 2
    signal = dataclasses.replace(base, payload_json=f'"{"x" * room}"')
    assert len(encode(signal)[0]) <= MAX_RECORD_BYTES
    assert "too large" in _reason(_incoming(signal, topic=f"{NS}.requests.team"), caps)
    assert isinstance(_judge(_incoming(signal)), Forward)


def test_authorities_come_from_json(tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNSTREAM_AUTHORITIES", '{"team": ["email", "sms"], "none": []}')
    assert load_authorities() == {"team": frozenset({"email", "sms"}), "none": frozenset()}
    for bad in ('{"team": "email"}', "[1]", "{", '{"a.b": []}'):
        monkeypatch.setenv("RUNSTREAM_AUTHORITIES", bad)
        with pytest.raises(InvalidInput):
            load_authorities()
    monkeypatch.delenv("RUNSTREAM_AUTHORITIES")
    assert load_authorities() == {}


def _in_lineage(record: ev.RunCancelRequested) -> ev.RunCancelRequested:
    """A request to a later round carries its lineage's id, as the client writes it."""
    envelope = dataclasses.replace(record.envelope, lineage_id="r1")
    return dataclasses.replace(record, envelope=envelope)


def _reason(incoming: Incoming, authorities: dict[str, frozenset[str]] | None = None) -> str:
    verdict = _judge(incoming, authorities)
    assert isinstance(verdict, Refuse), verdict
    return verdict.reason


async def test_a_restricted_client_is_told_at_once_it_may_not_take_a_fire_id() -> None:
    # (the relay refuses it: the create waited out the relay's timeout, then asked whether
    # a worker was up)
    from runstream import Client

    fire_id = "nightly@2026-12-06T12:14:00.000Z"
    client = Client(bootstrap_servers="127.0.0.1:1", namespace="ns", authority_name="team")
    try:  # (refused before anything connects: nothing listens there)
        with pytest.raises(InvalidInput, match="shape of a schedule's fired run"):
            await client.create_run("f", None, run_id=fire_id)
        with pytest.raises(InvalidInput, match="shape of a schedule's fired run"):
            await client.signal_with_start("f", None, run_id=fire_id, signal="go")
    finally:
        await client.close()


async def test_an_empty_request_id_is_refused_by_the_client_and_the_env() -> None:
    # (an empty id stood for none: each send got a random one, and a retry the caller meant
    # to be deduplicated was applied twice)
    from runstream import Client
    from runstream.testing import TestEnvironment

    client = Client(bootstrap_servers="127.0.0.1:1", namespace="ns")
    try:  # (refused before anything connects: nothing listens there)
        with pytest.raises(InvalidInput, match="request id must not be empty"):
            await client.signal("r1", "go", 1, request_id="")
        with pytest.raises(InvalidInput, match="request id must not be empty"):
            await client.update("r1", "u", 1, request_id="")
        with pytest.raises(InvalidInput, match="request id must not be empty"):
            await client.signal_with_start("f", None, run_id="r1", signal="go", request_id="")
    finally:
        await client.close()
    from runstream import Flow, FlowContext

    waiter: Flow[None, object] = Flow("empty-id-waiter")

    @waiter.handler
    async def _wait(ctx: FlowContext, payload: None) -> object:
        return await ctx.wait_for("go")

    async with TestEnvironment([waiter]) as env:
        await env.start(waiter, None, run_id="r1")
        with pytest.raises(InvalidInput, match="request id must not be empty"):
            await env.signal("r1", "go", 1, request_id="")
