"""`runstream schemas register`: the requests it builds and how it judges the answers.

The registry here is an in-memory model of the Confluent REST API's rules that matter (ids
chosen by the registry unless the subject is in IMPORT mode, IMPORT only on an empty subject
unless forced, a lookup answering 404 for an unknown schema); the real-registry test is
tests/integration/test_schema_registry.py.
"""

from __future__ import annotations

import collections
import json
import re
from dataclasses import dataclass, field
from typing import Any

import pytest

from runstream.engine.journal.schema_ids import SchemaRegistry
from runstream.engine.kafka.confluent_registry import (
    HttpAnswer,
    HttpCall,
    Registration,
    SchemaRegistrationError,
    lookup,
    register,
    register_schemas,
    registrations,
    reset_mode,
    same_schema,
    set_mode,
    subject_of,
)

URL = "http://registry.test"


@dataclass
class FakeRegistry:
    """subject -> [(id, schema text)]; ids -> schema text; per-subject modes."""

    subjects: dict[str, list[tuple[int, str]]] = field(default_factory=dict)
    ids: dict[int, str] = field(default_factory=dict)
    modes: dict[str, str] = field(default_factory=dict)
    calls: list[HttpCall] = field(default_factory=list)
    next_id: int = 10_000

    def __call__(self, call: HttpCall) -> HttpAnswer:
        self.calls.append(call)
        for pattern, handler in self._routes():
            match = re.fullmatch(pattern, call.path)
            if match:
                answer: HttpAnswer = handler(call, *match.groups())
                return answer
        return HttpAnswer(404, {"error_code": 404, "message": "HTTP 404 Not Found"})

    def _routes(self) -> list[tuple[str, Any]]:
        return [(r"/schemas/ids/(\d+)", self._by_id), (r"/subjects/([^/]+)", self._lookup),
                (r"/subjects/([^/]+)/versions", self._versions),
                (r"/mode/([^/?]+)(\?force=true)?", self._mode)]

    def _by_id(self, call: HttpCall, schema_id: str) -> HttpAnswer:
        if int(schema_id) in self.ids:
            return HttpAnswer(200, {"schema": self.ids[int(schema_id)]})
        return HttpAnswer(404, {"error_code": 40403, "message": "Schema not found"})

    def _lookup(self, call: HttpCall, subject: str) -> HttpAnswer:
        assert call.method == "POST" and call.body is not None
        for index, (schema_id, text) in enumerate(self.subjects.get(subject, [])):
            if json.loads(text) == json.loads(call.body["schema"]):
                return HttpAnswer(200, {"subject": subject, "id": schema_id,
                                        "version": index + 1, "schema": text})
        return HttpAnswer(404, {"error_code": 40403, "message": "Schema not found"})

    def _versions(self, call: HttpCall, subject: str) -> HttpAnswer:
        versions = self.subjects.get(subject, [])
        if call.method == "GET":
            if not versions:
                return HttpAnswer(404, {"error_code": 40401, "message": "Subject not found"})
            return HttpAnswer(200, list(range(1, len(versions) + 1)))
        assert call.method == "POST" and call.body is not None
        wanted = call.body.get("id")
        if wanted is not None and self.modes.get(subject) != "IMPORT":
            return HttpAnswer(422, {"error_code": 42205, "message": "not in IMPORT mode"})
        schema_id = wanted if wanted is not None else self._new_id()
        versions.append((schema_id, call.body["schema"]))
        self.subjects[subject] = versions
        self.ids[schema_id] = call.body["schema"]
        return HttpAnswer(200, {"id": schema_id})

    def _mode(self, call: HttpCall, subject: str, force: str | None) -> HttpAnswer:
        if call.method == "DELETE":
            self.modes.pop(subject, None)
            return HttpAnswer(200, {"mode": "READWRITE"})
        assert call.body is not None
        if call.body["mode"] == "IMPORT" and self.subjects.get(subject) and not force:
            return HttpAnswer(422, {"error_code": 42205, "message": "subject not empty"})
        self.modes[subject] = call.body["mode"]
        return HttpAnswer(200, call.body)

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id


@pytest.fixture(scope="module")
def plan() -> list[Registration]:
    return registrations(SchemaRegistry.load())


def test_every_journal_schema_is_planned_under_its_fixed_id(plan: list[Registration]) -> None:
    registry = SchemaRegistry.load()
    planned = {r.schema_id: r for r in plan}
    for version in registry.versions():
        item = planned.pop(version.schema_id)
        assert item.record_type == version.record_type
        assert json.loads(item.schema_json) == version.schema()
        assert item.subject == f"runstream.journal.{version.schema()['name']}"
    # What is left is the envelope, under its reserved id.
    assert [(r.schema_id, r.subject) for r in planned.values()] == [
        (1, "runstream.journal.Envelope")]


def test_the_versions_of_one_record_share_a_subject_in_id_order(
    plan: list[Registration],
) -> None:
    claimed = [r.schema_id for r in plan if r.subject == "runstream.journal.PartitionEpochClaimed"]
    assert claimed == sorted(claimed) and len(claimed) == 3
    assert len({r.subject for r in plan}) == len({r.record_type for r in plan})


def test_the_requests_follow_the_confluent_api() -> None:
    item = Registration(116, "runstream.journal.RunCompleted", "run.completed", '{"x": 1}')
    assert register(item) == HttpCall(
        "POST", "/subjects/runstream.journal.RunCompleted/versions",
        {"schema": '{"x": 1}', "schemaType": "AVRO", "id": 116})
    assert lookup(item) == HttpCall("POST", "/subjects/runstream.journal.RunCompleted",
                                    {"schema": '{"x": 1}'})
    assert set_mode("a/b", "IMPORT", force=True) == HttpCall(
        "PUT", "/mode/a%2Fb?force=true", {"mode": "IMPORT"})
    assert reset_mode("s") == HttpCall("DELETE", "/mode/s")
    assert subject_of({"name": "X", "namespace": "n"}) == "n.X"
    assert subject_of({"name": "m.X", "namespace": "n"}) == "m.X"


def test_a_first_run_registers_everything_under_its_id_then_leaves_import_mode(
    plan: list[Registration],
) -> None:
    fake = FakeRegistry()
    lines: list[str] = []
    report = register_schemas(URL, transport=fake, progress=lines.append)
    assert report.changed and not report.unchanged
    assert {r.schema_id for r in report.registered} == {r.schema_id for r in plan}
    assert fake.ids == {r.schema_id: r.schema_json for r in plan}
    assert fake.modes == {}, "every subject's mode was reset"
    assert len(lines) == len(plan) and lines[0].startswith("registered id 1: ")
    assert report.summary().startswith(f"registered {len(plan)} of {len(plan)} ")


def test_a_second_run_changes_nothing_and_says_so(plan: list[Registration]) -> None:
    fake = FakeRegistry()
    register_schemas(URL, transport=fake)
    fake.calls.clear()
    report = register_schemas(URL, transport=fake)
    assert not report.changed and len(report.unchanged) == len(plan)
    assert {c.method for c in fake.calls} <= {"GET", "POST"}
    assert not [c for c in fake.calls if c.path.endswith("/versions")]
    assert report.summary() == (f"all {len(plan)} journal schemas already registered in "
                                f"{URL} under their ids: nothing changed")
    assert report.as_dict()["changed"] is False


def test_a_new_version_of_a_populated_subject_forces_import_mode(
    plan: list[Registration],
) -> None:
    fake = FakeRegistry()
    register_schemas(URL, transport=fake)
    versions = collections.Counter(r.subject for r in plan)
    newest = max((r for r in plan if versions[r.subject] > 1), key=lambda r: r.schema_id)
    fake.subjects[newest.subject].pop()  # as if this version were added since the last run
    del fake.ids[newest.schema_id]
    fake.calls.clear()
    report = register_schemas(URL, transport=fake)
    assert [r.schema_id for r in report.registered] == [newest.schema_id]
    mode_calls = [c for c in fake.calls if c.path.startswith("/mode/")]
    assert [(c.method, c.path.endswith("?force=true")) for c in mode_calls] == [
        ("PUT", True), ("DELETE", False)]


def test_an_id_taken_by_another_schema_is_one_clear_error() -> None:
    other = json.dumps({"type": "record", "name": "Other", "namespace": "acme", "fields": []})
    fake = FakeRegistry(ids={116: other})
    with pytest.raises(SchemaRegistrationError) as caught:
        register_schemas(URL, transport=fake)
    message = str(caught.value)
    assert message.startswith(f"schema id 116 in {URL} already holds another schema "
                              "(acme.Other), not runstream.journal.RunCompleted")
    assert "\n" not in message
    assert not [c for c in fake.calls if c.method in ("PUT", "DELETE")], "nothing changed"


def test_our_schema_under_another_id_in_its_subject_is_an_error(
    plan: list[Registration],
) -> None:
    envelope = plan[0]
    fake = FakeRegistry(subjects={envelope.subject: [(7, envelope.schema_json)]},
                        ids={7: envelope.schema_json})
    with pytest.raises(SchemaRegistrationError, match="under id 7: records framed with 1 "):
        register_schemas(URL, transport=fake)


def test_a_registry_that_ignores_the_id_is_refused(plan: list[Registration]) -> None:
    class IgnoresIds(FakeRegistry):
        def __call__(self, call: HttpCall) -> HttpAnswer:
            if call.method == "POST" and call.path.endswith("/versions") and call.body:
                call = HttpCall(call.method, call.path, {"schema": call.body["schema"]})
            return super().__call__(call)

    with pytest.raises(SchemaRegistrationError, match="under id 10001, not 1: it ignores"):
        register_schemas(URL, transport=IgnoresIds())


def test_a_refused_mode_switch_names_the_reason() -> None:
    class NoImport(FakeRegistry):
        def _mode(self, call: HttpCall, subject: str, force: str | None) -> HttpAnswer:
            return HttpAnswer(405, {"error_code": 405, "message": "mode is not supported"})

    with pytest.raises(SchemaRegistrationError) as caught:
        register_schemas(URL, transport=NoImport())
    assert str(caught.value) == (
        f"{URL} refused to put subject runstream.journal.Envelope in IMPORT mode (needed to "
        "keep fixed ids): mode is not supported (error 405)")


def test_reformatted_schemas_count_as_the_same(plan: list[Registration]) -> None:
    item = plan[5]
    compact = json.dumps(json.loads(item.schema_json), separators=(",", ":"), sort_keys=True)
    assert same_schema(compact, item.schema_json)
    without_docs = json.loads(item.schema_json)
    without_docs.pop("doc", None)
    assert same_schema(json.dumps(without_docs), item.schema_json)
    assert not same_schema(plan[6].schema_json, item.schema_json)
    assert not same_schema("not json", item.schema_json)


def test_no_registry_answering_is_one_line() -> None:
    with pytest.raises(SchemaRegistrationError,
                       match=r"^no schema registry answers at http://127\.0\.0\.1:1: "):
        register_schemas("http://127.0.0.1:1")
