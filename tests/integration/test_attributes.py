"""Run attributes and queries (issue 21 item 1) on a real broker, through every door a user
has: a Client with a Flow object and by flow name, a signal-with-start, the CLI (`run create
--attributes`, `runs list|count --where`) and a create request a plain Kafka producer writes
from schemas/ alone (`attributes_json`). A handler's `ctx.set_attributes` (a removal, a
list) seen by queries as the run moves on, and written once across a kill -9 of its worker;
bad attributes refused before sending (Client, CLI) or rejected by the owner (a plain
producer's); the query grammar, paging and counting answered by the read model; and a run
that expires leaving no query index key behind.

Most tests share one in-process worker on one namespace (the `shared` fixture), each on runs
of its own (an attribute `suite` names them); the kill -9 and the expiry tests have their
own namespace and worker."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rocksdict import AccessType, Options, Rdict

from runstream import (
    Client,
    Flow,
    FlowContext,
    InvalidAttributes,
    QueryInvalid,
    RunExpired,
    RunNotFound,
    RunStatus,
)
from runstream.engine.journal import events as ev
from runstream.engine.kafka.admin import delete_topics, ensure_topics
from runstream.engine.readmodel.model import read_model_dir
from runstream.projections import query_index
from runstream.projections.attributes import as_dict
from tests.conftest import TEST_JOURNAL_PARTITIONS
from tests.integration.support import WorkerProcess, fold, running_worker, status_when, until
from tests.integration.test_cli import Result, cli, one_line_error
from tests.integration.test_lifetime import plain_request, produce_plain

noted: Flow[Any, Any] = Flow("attr-noted")
stager: Flow[Any, Any] = Flow("attr-stager")
survivor: Flow[Any, Any] = Flow("attr-survivor")

SHIPPED_AT = datetime(2026, 12, 3, 8, 30, tzinfo=UTC)


@noted.handler
async def _noted(ctx: FlowContext, payload: Any) -> Any:
    return payload


@stager.handler
async def _stager(ctx: FlowContext, payload: Any) -> Any:
    """Sets attributes (removing the create's `vip`, adding a list), waits, sets again."""
    await ctx.set_attributes({"stage": "paid", "tags": ["gift", "eu"], "vip": None,
                              "amount": 12.5})
    await ctx.wait_for("ship")
    await ctx.set_attributes({"stage": "shipped", "amount": None, "shipped": SHIPPED_AT})
    return {"stage": ctx.attributes["stage"], "tags": ctx.attributes["tags"]}


@survivor.handler
async def _survivor(ctx: FlowContext, payload: Any) -> Any:
    """Sets attributes, then holds in a step until the test releases it (the worker is
    killed meanwhile), then sets them again."""
    await ctx.set_attributes({"stage": "held", "temp": 1, "tags": ["x", "y"]})
    await ctx.step("hold", _hold, payload["started"], payload["release"], timeout=120)
    await ctx.set_attributes({"stage": "done", "temp": None})
    return ctx.attributes


def _hold(started: str, release: str) -> str:
    """(A plain function with a timeout: it runs in a thread, the worker's loop goes on.)"""
    with open(started, "a") as out:  # which process ran the step
        out.write(f"{os.getpid()}\n")
    while not os.path.exists(release):
        time.sleep(0.05)
    return "released"


# The flows of the worker process in the kill -9 test (`--app` of this module).
process_flows = [survivor]
APP = "tests.integration.test_attributes:process_flows"


@dataclass
class Shared:
    bootstrap: str
    namespace: str
    journal: str
    client: Client  # knows the flows
    nameless: Client  # knows none (as every non-Python producer)
    cache: Path  # the CLI's cache root: its read model is the one `nameless` writes

    async def cli(self, *args: str) -> Result:
        return await cli(*args, bootstrap=self.bootstrap, namespace=self.namespace,
                         cache=self.cache)

    async def cli_json(self, *args: str) -> Any:
        result = await self.cli(*args, "--json")
        assert result.code == 0, result.err
        return json.loads(result.out)


@pytest.fixture(scope="module")
async def shared(bootstrap: str, tmp_path_factory: pytest.TempPathFactory
                 ) -> AsyncIterator[Shared]:
    """One namespace and one in-process worker for the module's tests that need no worker
    of their own."""
    namespace = f"t-{uuid.uuid4().hex[:8]}"
    report = await ensure_topics(bootstrap, namespace, partitions=TEST_JOURNAL_PARTITIONS)
    assert report.ok, report.mismatches()
    root = tmp_path_factory.mktemp("attributes")
    # The CLI reads the read model `nameless` keeps (as a CLI next to an application's
    # Client on the default cache): once `nameless` queried, each CLI call is a secondary
    # answering from the store plus what it folded since (runstream.engine.readmodel).
    shared_model = read_model_dir(bootstrap, namespace, root=root / "cache")
    try:
        async with running_worker(bootstrap, namespace, root / "w", [noted, stager]), \
                Client(bootstrap_servers=bootstrap, namespace=namespace, flows=[noted, stager],
                       read_model_dir=root / "rm") as client, \
                Client(bootstrap_servers=bootstrap, namespace=namespace,
                       read_model_dir=shared_model) as nameless:
            yield Shared(bootstrap, namespace, report.journal.name, client, nameless,
                         root / "cache")
    finally:
        if os.environ.get("RUNSTREAM_KEEP_TOPICS") != "1":
            await delete_topics(bootstrap, namespace)


async def ids(client: Client, where: str, **options: Any) -> list[str]:
    return [run.run_id for run in await client.list_runs(where=where, **options)]


# -- every door -----------------------------------------------------------------------------

DUE = datetime(2026, 12, 1, tzinfo=UTC)


def _door_attributes(door: str, n: int) -> dict[str, Any]:
    return {"suite": "doors", "door": door, "n": n, "score": n + 0.5, "vip": n % 2 == 0,
            "due": DUE, "tags": ["door", door]}


def _wire(values: dict[str, Any]) -> str:
    """The attributes as a non-Python writer puts them in JSON (a time as {"$time": ...})."""
    return json.dumps({k: {"$time": v.isoformat()} if isinstance(v, datetime) else v
                       for k, v in values.items()})


async def test_attributes_of_a_create_through_every_door_are_found_by_queries(
    shared: Shared,
) -> None:
    s = shared
    doors = {"flow": 1, "name": 2, "sws": 3, "cli": 4, "producer": 5}
    await s.client.create_run(noted, "flow", run_id="door-flow",
                              attributes=_door_attributes("flow", 1))
    await s.nameless.create_run(noted.name, "name", run_id="door-name",
                                attributes=_door_attributes("name", 2))
    await s.nameless.signal_with_start(noted.name, "sws", run_id="door-sws", signal="go",
                                       attributes=_door_attributes("sws", 3))
    made = await s.cli("run", "create", noted.name, "--payload", '"cli"', "--id", "door-cli",
                       "--attributes", _wire(_door_attributes("cli", 4)))
    assert made.code == 0, made.err
    await produce_plain(s.bootstrap, s.journal, "door-producer", plain_request(
        "run.create-requested", "door-producer", flow=noted.name, payload_json='"producer"',
        attributes_json=_wire(_door_attributes("producer", 5))))
    for door in doors:
        assert await s.client.get_handle(f"door-{door}").result(timeout=60) == door

    for door, n in doors.items():
        [run] = await s.client.list_runs(where=f"door = '{door}'")
        assert run.run_id == f"door-{door}"
        assert as_dict(run.attributes) == _door_attributes(door, n)  # each value typed
        kinds = {a.name: a.kind for a in run.attributes}
        assert kinds == {"suite": "str", "door": "str", "n": "int", "score": "float",
                         "vip": "bool", "due": "time", "tags": "list"}
    assert sorted(await ids(s.client, "suite = 'doors'")) == sorted(
        f"door-{d}" for d in doors)
    assert sorted(await ids(s.nameless, "suite = 'doors' and n >= 3")) == [
        "door-cli", "door-producer", "door-sws"]
    assert await ids(s.client, "tags = 'producer' and vip = false") == ["door-producer"]
    assert await ids(s.client, "tags = 'name' and vip = true") == ["door-name"]

    listed = await s.cli_json("runs", "list", "--where", "suite = 'doors'")
    by_id = {view["run_id"]: view for view in listed}
    assert sorted(by_id) == sorted(f"door-{d}" for d in doors)
    for door, n in doors.items():
        shown = by_id[f"door-{door}"]["attributes"]
        assert shown["door"] == door and shown["n"] == n and shown["score"] == n + 0.5
        assert shown["tags"] == ["door", door] and shown["vip"] is (n % 2 == 0)
        assert datetime.fromisoformat(shown["due"].replace("Z", "+00:00")) == DUE
    for door in doors:
        [one] = await s.cli_json("runs", "list", "--where", f"door = '{door}'")
        assert one["run_id"] == f"door-{door}" and one["status"] == "completed"


# -- ctx.set_attributes ---------------------------------------------------------------------


async def test_a_handler_s_attributes_are_seen_by_queries_as_the_run_moves_on(
    shared: Shared,
) -> None:
    s = shared
    handle = await s.client.create_run(stager, None, run_id="stage-1", attributes={
        "suite": "stager", "customer": "c-1", "vip": True})
    await s.client.create_run(noted, None, run_id="stage-other", attributes={
        "suite": "stager", "customer": "c-2", "vip": True})
    await status_when(s.client, "stage-1", RunStatus.suspended)
    waiting = "suite = 'stager' and stage = 'paid'"
    assert await ids(s.client, waiting) == ["stage-1"]
    assert await ids(s.client, "suite = 'stager' and vip is null") == ["stage-1"]  # removed
    assert await ids(s.client, "suite = 'stager' and vip = true") == ["stage-other"]
    assert await ids(s.client, "tags = 'eu' and amount = 12.5") == ["stage-1"]  # a list
    assert await ids(s.client, "customer = 'c-1' and status = 'suspended'") == ["stage-1"]
    assert await ids(s.nameless, waiting) == ["stage-1"]  # (the CLI's store indexes it so)

    await s.client.signal("stage-1", "ship")
    assert await handle.result(timeout=60) == {"stage": "shipped", "tags": ["gift", "eu"]}
    assert await ids(s.client, waiting) == []
    done = ("suite = 'stager' and stage = 'shipped' and amount is null and "
            f"shipped = timestamp '{SHIPPED_AT.isoformat()}' and customer = 'c-1'")
    assert await ids(s.client, done) == ["stage-1"]
    [run] = await s.client.list_runs(where=done, status=RunStatus.completed)
    assert as_dict(run.attributes) == {"suite": "stager", "customer": "c-1",
                                       "stage": "shipped", "tags": ["gift", "eu"],
                                       "shipped": SHIPPED_AT}
    # The CLI (a secondary: `nameless` has not caught up since) finds the run by what the
    # journal says now, not by its store's index entries of `stage = 'paid'`.
    [view] = await s.cli_json("runs", "list", "--where", "stage = 'shipped'")
    assert view["run_id"] == "stage-1"
    assert view["attributes"]["tags"] == ["gift", "eu"] and "vip" not in view["attributes"]
    assert await s.cli_json("runs", "list", "--where", waiting) == []

    kinds = [entry.kind for entry in await s.client.journal("stage-1")]
    assert kinds.count("attributes") == 2, kinds
    history = (await fold(s.bootstrap, s.namespace)).history["stage-1"]
    sets = [i.record for i in history if isinstance(i.record, ev.StepCompleted)
            and i.record.kind == "attributes"]
    assert len(sets) == 2  # (the replay after the wait wrote no third)


async def test_attributes_set_before_a_kill_9_are_set_once_by_the_worker_that_finishes(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
) -> None:
    effects = tmp_path / "effects"
    started, release = tmp_path / "started", tmp_path / "release"
    a = WorkerProcess(bootstrap, namespace, tmp_path / "a", "a", effects, app=APP).start()
    b: WorkerProcess | None = None
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[survivor], read_model_dir=tmp_path / "rm") as client:
            handle = await client.create_run(
                survivor, {"started": str(started), "release": str(release)}, run_id="surv",
                attributes={"suite": "survivor"})

            async def held() -> bool:
                return started.exists() and await ids(client, "stage = 'held'") == ["surv"]
            await until(held, "the run to set its attributes and hold")
            assert await ids(client, "temp = 1 and tags = 'y'") == ["surv"]
            a.signal(signal.SIGKILL)
            release.touch()
            b = WorkerProcess(bootstrap, namespace, tmp_path / "b", "b", effects,
                              app=APP).start()
            result = await handle.result(timeout=90)
            assert result == {"suite": "survivor", "stage": "done", "tags": ["x", "y"]}
            pids = [int(line) for line in started.read_text().split()]
            assert pids[0] == a.pid and pids[-1] == b.pid  # the step ran again on b
            assert await ids(client, "stage = 'held'") == []
            assert await ids(client, "stage = 'done' and temp is null and tags = 'x'") == [
                "surv"]
            [run] = await client.list_runs(where="suite = 'survivor'")
            assert as_dict(run.attributes) == result
        view = await fold(bootstrap, namespace)
        sets = [json.loads(i.record.result_json) for i in view.history["surv"]
                if isinstance(i.record, ev.StepCompleted) and i.record.kind == "attributes"]
        assert sets == [{"stage": "held", "temp": 1, "tags": ["x", "y"]},
                        {"stage": "done", "temp": None}]
        holds = [i for i in view.history["surv"] if isinstance(i.record, ev.StepCompleted)
                 and i.record.kind != "attributes"]
        assert len(holds) == 1
    finally:
        a.stop()
        if b is not None:
            assert b.stop() == 0, b.log_text()[-3000:]


# -- validation -----------------------------------------------------------------------------

BAD: list[tuple[dict[str, Any], str]] = [
    ({"9lives": 1}, "does not match"),
    ({"status": "mine"}, "reserved"),
    ({"n": float("nan")}, "finite"),
    ({"when": datetime(2026, 1, 1)}, "needs a timezone"),
    ({"xs": ["a", 1]}, "only strings"),
    ({"o": {"a": 1}}, "none of str"),
    ({f"a{i}": i for i in range(65)}, "at most 64"),
    ({"big": "x" * 2100}, "at most 2048"),
]


async def test_bad_attributes_are_refused_before_sending_or_rejected_by_the_owner(
    shared: Shared,
) -> None:
    s = shared
    for n, (attributes, message) in enumerate(BAD):
        with pytest.raises(InvalidAttributes, match=message):
            await s.client.create_run(noted, None, run_id=f"refused-{n}", attributes=attributes)
        with pytest.raises(InvalidAttributes, match=message):
            await s.nameless.create_run(noted.name, None, run_id=f"refused-{n}",
                                        attributes=attributes)
        with pytest.raises(InvalidAttributes, match=message):
            await s.nameless.signal_with_start(noted.name, None, run_id=f"refused-{n}",
                                               signal="go", attributes=attributes)
    reserved = one_line_error(await s.cli(
        "run", "create", noted.name, "--id", "refused-cli", "--attributes", '{"flow": "x"}'))
    assert "--attributes" in reserved and "reserved" in reserved
    naive = one_line_error(await s.cli(
        "run", "create", noted.name, "--id", "refused-cli", "--attributes",
        '{"due": {"$time": "2026-12-01T00:00:00"}}'))
    assert "--attributes" in naive and "no zone" in naive
    not_json = one_line_error(await s.cli(
        "run", "create", noted.name, "--id", "refused-cli", "--attributes", "{oops"))
    assert "--attributes" in not_json and "not JSON" in not_json

    foreign = {  # what a plain producer may write, and the owner cannot take
        "p-bad-reserved": '{"status": "mine"}',
        "p-bad-name": '{"bad name": 1}',
        "p-bad-array": '["a"]',
        "p-bad-json": "{oops",
        "p-bad-null": '{"gone": null}',
        "p-bad-object": '{"o": {"a": 1}}',
        "p-bad-list": '{"xs": ["a", 1]}',
        "p-bad-naive": '{"due": {"$time": "2026-12-01T00:00:00"}}',
        "p-bad-many": json.dumps({f"a{i}": i for i in range(65)}),
        "p-bad-big": json.dumps({"big": "x" * 2100}),
        # (a lone surrogate in plain ASCII JSON: every fold of it failed, wedging the
        # partition for its owner, read models and time travel)
        "p-bad-surrogate": '{"s": "\\udcff"}',
        "p-bad-surrogates": '{"xs": ["ok", "\\ud800"]}',
    }
    for run_id, text in foreign.items():
        await produce_plain(s.bootstrap, s.journal, run_id, plain_request(
            "run.create-requested", run_id, flow=noted.name, payload_json="1",
            attributes_json=text))
    await produce_plain(s.bootstrap, s.journal, "p-good", plain_request(
        "run.create-requested", "p-good", flow=noted.name, payload_json="1",
        attributes_json='{"suite": "foreign"}'))
    assert await s.client.get_handle("p-good").result(timeout=60) == 1

    async def all_rejected() -> bool:
        view = await fold(s.bootstrap, s.namespace)
        return all(any(isinstance(i.record, ev.RunCreateRejected)
                       for i in view.history.get(run_id, [])) for run_id in foreign)
    await until(all_rejected, "the owner to reject every bad create")
    view = await fold(s.bootstrap, s.namespace)
    for run_id in foreign:
        kinds = [i.record for i in view.history[run_id] if i.record is not None]
        [refusal] = [r for r in kinds if isinstance(r, ev.RunCreateRejected)]
        assert refusal.reason == "attributes-invalid", (run_id, refusal)
        assert not any(isinstance(r, ev.RunCreated | ev.RunActivated) for r in kinds), run_id
        assert view.store.run(run_id) is None, run_id
        with pytest.raises(RunNotFound):
            await s.nameless.describe(run_id)
    for n in range(len(BAD)):  # nothing was sent for what the Client and the CLI refused
        assert f"refused-{n}" not in view.history
    assert "refused-cli" not in view.history
    assert await s.client.count_runs("run_id starts_with 'p-bad' or run_id starts_with "
                                     "'refused'") == 0
    assert await ids(s.client, "suite = 'foreign'") == ["p-good"]


# -- the grammar ----------------------------------------------------------------------------

GRAMMAR: dict[str, dict[str, Any]] = {
    "g-int": {"amount": 5, "region": "eu-west", "due": datetime(2026, 12, 1, tzinfo=UTC),
              "tags": ["a", "b"]},
    "g-float": {"amount": 7.5, "region": "eu-north", "vip": True,
                "due": datetime(2026, 12, 10, tzinfo=UTC)},
    "g-str": {"amount": "5", "region": "us-east", "vip": False},
    "g-none": {"region": "ap-south", "tags": ["b"]},
}


async def test_the_query_grammar_through_the_broker(shared: Shared) -> None:
    s = shared
    handles = [await s.client.create_run(noted, run_id, run_id=run_id,
                                         attributes={"suite": "grammar", **values})
               for run_id, values in GRAMMAR.items()]
    for handle in handles:
        await handle.result(timeout=60)
    await asyncio.sleep(0.05)
    middle = datetime.now(UTC)
    await asyncio.sleep(0.05)
    await (await s.client.create_run(noted, 0, run_id="g-late", attributes={
        "suite": "grammar", "amount": 1, "region": "eu-late"})).result(timeout=60)
    before = ["g-float", "g-int", "g-none", "g-str"]

    cases = {
        "amount = 5": ["g-int"],  # a number: not the string '5'
        "amount = '5'": ["g-str"],
        "amount > 6": ["g-float"],
        "amount >= 5.0": ["g-float", "g-int"],
        "amount < 100": ["g-float", "g-int", "g-late"],
        "amount != 5": ["g-float", "g-late"],  # numbers other than 5 only
        "amount <= 'z'": ["g-str"],
        "region in ('eu-west', 'us-east', 'nowhere')": ["g-int", "g-str"],
        "region starts_with 'eu-'": ["g-float", "g-int", "g-late"],
        "region starts_with 'eu-n' or region starts_with 'ap'": ["g-float", "g-none"],
        "amount is null": ["g-none"],
        "vip is not null": ["g-float", "g-str"],
        "vip = true": ["g-float"],
        "vip = 'true'": [],
        "tags = 'b'": ["g-int", "g-none"],
        "tags in ('a', 'zzz')": ["g-int"],
        "region = 'us-east' or region = 'ap-south' and amount is null": ["g-none", "g-str"],
        "(region = 'us-east' or region = 'ap-south') and amount is null": ["g-none"],
        "(amount > 6 or (region starts_with 'us' and vip = false)) and flow = 'attr-noted'":
            ["g-float", "g-str"],
        "due < timestamp '2026-12-05T00:00:00Z'": ["g-int"],
        "due >= timestamp '2026-12-10T01:00:00+01:00'": ["g-float"],
        "due < '2026-12-05T00:00:00Z'": [],  # a string: due holds a time
        f"created >= timestamp '{middle.isoformat()}'": ["g-late"],
        f"created < '{middle.isoformat()}'": before,  # a built-in time reads a string
        f"created < timestamp '{middle.isoformat()}' and settled is not null": before,
        "status = 'completed' and round = 0": [*before, "g-late"],
    }
    for where, expected in cases.items():
        query = f"suite = 'grammar' and ({where})"
        assert sorted(await ids(s.client, query)) == sorted(expected), where
        assert await s.client.count_runs(query) == len(expected), where
    listed = await s.cli_json("runs", "list", "--where",
                              "suite = 'grammar' and (amount = '5' or amount > 6)")
    assert sorted(v["run_id"] for v in listed) == ["g-float", "g-str"]
    counted = await s.cli_json("runs", "count", "--where",
                               "suite = 'grammar' and region starts_with 'eu-'")
    assert counted["count"] == 3

    for query, position in (("suite = 'grammar' and amount >", 30),
                            ("amount == 5", 8), ("region = 'open", 9),
                            ("(suite = 'grammar'", 18), ("created < 'yesterday'", 10),
                            ("status = 'asleep'", 9), ("due < timestamp 5", 16)):
        with pytest.raises(QueryInvalid) as caught:
            await s.client.list_runs(where=query)
        assert caught.value.position == position, (query, str(caught.value))
        assert f"(at position {position})" in str(caught.value)
    with pytest.raises(QueryInvalid) as counting:
        await s.client.count_runs("amount in 5")
    assert counting.value.position == 10
    line = one_line_error(await s.cli("runs", "list", "--where", "amount == 5", "--json"))
    assert "(at position 8)" in line
    line = one_line_error(await s.cli("runs", "count", "--where", "region = 'open"))
    assert "not closed" in line and "(at position 9)" in line


# -- paging ---------------------------------------------------------------------------------

PAGES = 8  # more than any listing below takes


async def test_pages_cover_every_run_once_in_either_order_and_count_agrees(
    shared: Shared,
) -> None:
    s = shared
    ranks = {f"pg-{i:02d}": (i * 7) % 11 for i in range(11)}
    handles = [await s.client.create_run(noted, None, run_id=run_id, attributes={
        "suite": "paging", "rank": rank}) for run_id, rank in ranks.items()]
    await asyncio.gather(*(h.result(timeout=60) for h in handles))
    where = "suite = 'paging'"
    everything = await s.client.list_runs(where=where)
    assert everything.next_after is None
    in_place = sorted(everything, key=lambda r: (r.partition, r.run_id))
    assert [r.run_id for r in everything] == [r.run_id for r in in_place]
    assert sorted(r.run_id for r in everything) == sorted(ranks)
    assert len({r.partition for r in everything}) > 1  # the pages cross partitions

    pages: list[list[str]] = []
    after = None
    for _ in range(PAGES):  # (a cursor that does not move on fails, not hangs)
        page = await s.client.list_runs(where=where, limit=4, after=after)
        pages.append([r.run_id for r in page])
        if page.next_after is None:
            break
        assert page.next_after == page[-1].run_id  # the default order's cursor: a run id
        after = page.next_after
    assert [len(p) for p in pages] == [4, 4, 3]
    assert [i for p in pages for i in p] == [r.run_id for r in in_place]

    by_rank = sorted(ranks, key=lambda run_id: -ranks[run_id])
    for order, expected in (("rank desc", by_rank), ("rank", by_rank[::-1])):
        seen: list[str] = []
        after = None
        for _ in range(PAGES):
            page = await s.client.list_runs(where=where, order_by=order, limit=3, after=after)
            seen += [r.run_id for r in page]
            if page.next_after is None:
                break
            assert page.next_after not in ranks  # an opaque cursor, not a run id
            after = page.next_after
        assert seen == expected, order

    upper = "suite = 'paging' and rank >= 5"
    assert await s.client.count_runs(upper) == len(await s.client.list_runs(where=upper)) == 6
    assert await s.client.count_runs(where, status=RunStatus.completed) == 11

    cli_pages: list[list[str]] = []
    after_args: list[str] = []
    for _ in range(PAGES):
        page_views = await s.cli_json("runs", "list", "--where", where, "--limit", "5",
                                      *after_args)
        cli_pages.append([v["run_id"] for v in page_views])
        if len(page_views) < 5:
            break
        after_args = ["--after", page_views[-1]["run_id"]]
    assert [i for p in cli_pages for i in p] == [r.run_id for r in in_place]
    seen = []
    after_args = []
    for _ in range(PAGES):
        page_views = await s.cli_json("runs", "list", "--where", where, "--order-by",
                                      "rank desc", "--limit", "5", *after_args)
        seen += [v["run_id"] for v in page_views]
        if len(page_views) < 5:
            break
        after_args = ["--after", page_views[-1]["cursor"]]
    assert seen == by_rank
    counted = await s.cli_json("runs", "count", "--where", where)
    assert counted["count"] == 11 == len(seen)
    upper_count = await s.cli_json("runs", "count", "--where", upper)
    assert upper_count["count"] == len(await s.cli_json("runs", "list", "--where", upper))


# -- expiry ---------------------------------------------------------------------------------


def _query_index_runs(path: Path) -> set[str]:
    """The run ids of every query index key (z/) in the RocksDB store at `path`, opened
    read-only."""
    db = Rdict(str(path), Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        found = set()
        for key in db.keys(from_key=query_index.PREFIX):
            assert isinstance(key, bytes)
            if not key.startswith(query_index.PREFIX):
                break
            found.add(query_index.key_run(key)[1])
        return found
    finally:
        db.close()


async def _expired(client: Client, run_id: str) -> bool:
    try:
        await client.describe(run_id)
    except RunExpired:
        return True
    return False


async def test_an_expired_run_is_no_longer_found_and_leaves_no_query_index_key(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path,
) -> None:
    model = tmp_path / "rm"
    where = "suite = 'expiry'"
    async with running_worker(bootstrap, namespace, tmp_path / "w", [noted, stager],
                              retention=timedelta(seconds=2),
                              tombstone_retention=timedelta(minutes=10)):
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[noted, stager], read_model_dir=model) as client:
            await client.create_run(stager, None, run_id="kept",
                                           attributes={"suite": "expiry"})
            gone = await client.create_run(noted, None, run_id="gone", attributes={
                "suite": "expiry", "due": DUE, "tags": ["t1", "t2"]})
            await gone.result(timeout=60)
            await status_when(client, "kept", RunStatus.suspended)
            assert sorted(await ids(client, where)) == ["gone", "kept"]
            assert await ids(client, "tags = 't2'") == ["gone"]
        assert {"gone", "kept"} <= _query_index_runs(model)
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[noted, stager], read_model_dir=model) as client:
            await until(lambda: _expired(client, "gone"), "the settled run to expire")
            assert await ids(client, where) == ["kept"]
            assert await ids(client, "tags = 't2' or due is not null") == []
            assert await client.count_runs(where) == 1
            assert (await client.describe("kept")).status is RunStatus.suspended
        listed = await cli("runs", "list", "--where", where, "--json", bootstrap=bootstrap,
                           namespace=namespace, cache=tmp_path / "fresh")
        assert listed.code == 0, listed.err
        assert [v["run_id"] for v in json.loads(listed.out)] == ["kept"]
    held = _query_index_runs(model)
    assert "gone" not in held and "kept" in held, held


async def test_an_attribute_named_like_a_query_word_is_queried_in_double_quotes(
    shared: Shared,
) -> None:
    """`Null` and `AND` are valid attribute names (words are case-insensitive, names are
    not), and a query could never name them: `Null = 1` read as a word. In double quotes
    a name is never a word, for the client and the CLI alike."""
    s = shared
    await s.client.create_run(noted, "words", run_id="word-named",
                              attributes={"Null": 1, "AND": "x", "suite": "words"})
    assert await s.client.get_handle("word-named").result(timeout=60) == "words"
    assert await ids(s.client, "\"Null\" = 1 and \"AND\" = 'x'") == ["word-named"]
    assert await ids(s.nameless, "suite = 'words' and \"Null\" is not null") == ["word-named"]
    [shown] = await s.cli_json("runs", "list", "--where", "\"AND\" = 'x' and suite = 'words'")
    assert shown["run_id"] == "word-named" and shown["attributes"]["Null"] == 1
    refused = await s.cli("runs", "list", "--where", "\"AND = 'x'")
    assert refused.code != 0 and "quoted name" in refused.err
