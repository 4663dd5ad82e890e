"""Register the journal's Avro schemas in a Confluent-compatible schema registry.

Every journal record is framed as magic byte 0 + a fixed 4-byte schema id (schemas/
registry.json). A registry assigns ids itself unless a subject is in IMPORT mode, in which a
registration may name its id: so each subject that still lacks a schema is switched to IMPORT
(`PUT /mode/<subject>`, with `force=true` when it already holds older versions), the schemas
are registered with their ids (`POST /subjects/<subject>/versions` with `"id"`), and the
subject's mode is reset (`DELETE /mode/<subject>`, or READWRITE where that is not supported).
Then any Confluent-aware tool (Redpanda Console, kcat -s, a Confluent deserializer) decodes
journal records by the id in their frame.

Subjects follow Confluent's RecordNameStrategy: the subject is the record's full name
(`runstream.journal.RunCompleted`). One topic carries many record types, so TopicNameStrategy
(`<topic>-value`) would force every type into one subject whose versions would have to be
mutually compatible. Each type's evolved schemas (current and archived ids) are the versions of
its subject, in id order, which is the order they were introduced. The envelope (id 1) is
registered too, under `runstream.journal.Envelope`: no record is written with it, but a shared
registry must not hand its id to another schema.

Idempotent: a schema already registered under its subject with its id is left alone, and a run
that finds everything in place changes nothing (no mode switch either). An id the registry
already gives to another schema, or a subject that holds our schema under another id, is an
error naming both: registering would make records decode as the wrong type.
"""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import fastavro.schema

from runstream.engine.errors import RunstreamError
from runstream.engine.journal.schema_ids import SchemaRegistry, SchemaVersion

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
DEFAULT_TIMEOUT_S = 10.0
EXAMPLE_URL = "http://localhost:8081"
_NOT_FOUND = 404
_UNSUPPORTED = frozenset({404, 405, 501})  # a registry without per-subject mode deletion

Progress = Callable[[str], None]


class SchemaRegistrationError(RunstreamError):
    """The registry refused a registration, holds conflicting ids, or does not answer."""


@dataclass(frozen=True)
class Registration:
    """One schema to register: the id the codec writes, its subject and its Avro text."""

    schema_id: int
    subject: str
    record_type: str  # "envelope" for the shared envelope
    schema_json: str


@dataclass(frozen=True)
class HttpCall:
    """One request to the registry's REST API (path relative to its base URL)."""

    method: str
    path: str
    body: dict[str, Any] | None = None


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    body: Any  # the decoded JSON body, or None when it was empty or not JSON


class Transport(Protocol):
    def __call__(self, call: HttpCall) -> HttpAnswer: ...


@dataclass
class RegisterReport:
    """What a registration run found and did, in id order (bounded by the schema count)."""

    registry_url: str
    registered: list[Registration] = field(default_factory=list)
    unchanged: list[Registration] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.registered)

    def summary(self) -> str:
        total = len(self.registered) + len(self.unchanged)
        if not self.registered:
            return (f"all {total} journal schemas already registered in {self.registry_url} "
                    "under their ids: nothing changed")
        return (f"registered {len(self.registered)} of {total} journal schemas in "
                f"{self.registry_url} under their fixed ids ({len(self.unchanged)} were already "
                "there)")

    def as_dict(self) -> dict[str, Any]:
        def rows(found: list[Registration]) -> list[dict[str, Any]]:
            return [{"id": r.schema_id, "subject": r.subject, "type": r.record_type}
                    for r in found]
        return {"registry": self.registry_url, "changed": self.changed,
                "registered": rows(self.registered), "unchanged": rows(self.unchanged)}


# ---- what to register (pure) -------------------------------------------------------------


def subject_of(schema: dict[str, Any]) -> str:
    """The RecordNameStrategy subject: the record's full name."""
    name = str(schema["name"])
    namespace = schema.get("namespace")
    return name if "." in name or not namespace else f"{namespace}.{name}"


def registrations(registry: SchemaRegistry | None = None) -> list[Registration]:
    """Every schema with a fixed id (the envelope and each record version), in id order."""
    registry = registry or SchemaRegistry.load()
    found = [_record_registration(version) for version in registry.versions()]
    envelope_id = _envelope_id(registry)
    if envelope_id is not None:
        envelope = registry.envelope_schema()
        found.append(Registration(envelope_id, subject_of(envelope), "envelope",
                                  json.dumps(envelope)))
    subjects: dict[str, str] = {}  # subject -> record type; bounded by the schema count
    for item in found:
        owner = subjects.setdefault(item.subject, item.record_type)
        if owner != item.record_type:
            raise SchemaRegistrationError(
                f"record types {owner} and {item.record_type} share the record name "
                f"{item.subject}: RecordNameStrategy subjects need distinct names")
    return sorted(found, key=lambda r: r.schema_id)


def _record_registration(version: SchemaVersion) -> Registration:
    return Registration(version.schema_id, subject_of(version.schema()), version.record_type,
                        version.schema_json)


def _envelope_id(registry: SchemaRegistry) -> int | None:
    """The envelope's id from registry.json (the codec reserves it; no record carries it)."""
    if registry.directory is None:
        return None
    document = json.loads((registry.directory / "registry.json").read_text("utf-8"))
    envelope_id = document.get("envelope", {}).get("id")
    return envelope_id if isinstance(envelope_id, int) else None


def same_schema(stored: str, ours: str) -> bool:
    """Whether the registry's text of a schema is ours. Registries may reformat a schema
    (whitespace, key order, dropped docs), so equal parsed JSON or equal Avro Parsing
    Canonical Form both count."""
    try:
        if json.loads(stored) == json.loads(ours):
            return True
        return bool(_canonical(stored) == _canonical(ours))
    except (ValueError, TypeError, KeyError):  # not JSON or not Avro: not ours
        return False


def _canonical(text: str) -> str:
    return str(fastavro.schema.to_parsing_canonical_form(
        fastavro.parse_schema(json.loads(text))))


# ---- the requests (pure) -----------------------------------------------------------------


def _subject_path(subject: str) -> str:
    return "/subjects/" + urllib.parse.quote(subject, safe="")


def schema_by_id(schema_id: int) -> HttpCall:
    return HttpCall("GET", f"/schemas/ids/{schema_id}")


def lookup(item: Registration) -> HttpCall:
    """Is this schema registered under its subject (and with which id)?"""
    return HttpCall("POST", _subject_path(item.subject), {"schema": item.schema_json})


def subject_versions(subject: str) -> HttpCall:
    return HttpCall("GET", _subject_path(subject) + "/versions")


def set_mode(subject: str, mode: str, *, force: bool = False) -> HttpCall:
    query = "?force=true" if force else ""
    return HttpCall("PUT", f"/mode/{urllib.parse.quote(subject, safe='')}{query}",
                    {"mode": mode})


def reset_mode(subject: str) -> HttpCall:
    return HttpCall("DELETE", f"/mode/{urllib.parse.quote(subject, safe='')}")


def register(item: Registration) -> HttpCall:
    """Register under the fixed id (accepted only while the subject is in IMPORT mode)."""
    return HttpCall("POST", _subject_path(item.subject) + "/versions",
                    {"schema": item.schema_json, "schemaType": "AVRO", "id": item.schema_id})


# ---- talking to the registry -------------------------------------------------------------


@dataclass(frozen=True)
class UrllibTransport:
    """The registry's REST API over the standard library's HTTP client."""

    base_url: str
    timeout: float = DEFAULT_TIMEOUT_S

    def __call__(self, call: HttpCall) -> HttpAnswer:
        data = None if call.body is None else json.dumps(call.body).encode()
        try:
            request = urllib.request.Request(
                self.base_url.rstrip("/") + call.path, data=data, method=call.method,
                headers={"Content-Type": CONTENT_TYPE, "Accept": CONTENT_TYPE})
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return HttpAnswer(response.status, _json_or_none(response.read()))
        except urllib.error.HTTPError as exc:
            return HttpAnswer(exc.code, _json_or_none(exc.read()))
        except (urllib.error.URLError, OSError, ValueError) as exc:  # (ValueError: a bad URL)
            reason = getattr(exc, "reason", exc)
            raise SchemaRegistrationError(
                f"no schema registry answers at {self.base_url}: {reason}") from exc


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


def _message(answer: HttpAnswer) -> str:
    body = answer.body
    if isinstance(body, dict) and "message" in body:
        code = body.get("error_code", answer.status)
        return f"{body['message']} (error {code})"
    return f"HTTP {answer.status}"


class _Registry:
    """The calls a registration run makes, with their answers judged."""

    def __init__(self, url: str, transport: Transport) -> None:
        self.url = url
        self.send = transport

    def expect(self, call: HttpCall, doing: str) -> HttpAnswer:
        answer = self.send(call)
        if not 200 <= answer.status < 300:
            raise SchemaRegistrationError(f"{self.url} refused to {doing}: {_message(answer)}")
        return answer

    def in_place(self, item: Registration) -> bool:
        """True if registered under its subject with its id; raises on a conflicting id."""
        by_id = self.send(schema_by_id(item.schema_id))
        if by_id.status == 200 and isinstance(by_id.body, dict):
            stored = str(by_id.body.get("schema", ""))
            if not same_schema(stored, item.schema_json):
                raise SchemaRegistrationError(
                    f"schema id {item.schema_id} in {self.url} already holds another schema "
                    f"({_name_of(stored)}), not {item.subject} ({item.record_type}): a "
                    "registry shared with other applications must leave runstream's ids free")
        elif by_id.status != _NOT_FOUND:
            raise SchemaRegistrationError(
                f"{self.url} refused to look up schema id {item.schema_id}: {_message(by_id)}")
        found = self.send(lookup(item))
        if found.status == _NOT_FOUND:
            return False
        if found.status != 200 or not isinstance(found.body, dict):
            raise SchemaRegistrationError(
                f"{self.url} refused to look up subject {item.subject}: {_message(found)}")
        if found.body.get("id") != item.schema_id:
            raise SchemaRegistrationError(
                f"subject {item.subject} in {self.url} holds schema id {item.schema_id}'s "
                f"schema under id {found.body.get('id')}: records framed with "
                f"{item.schema_id} would not resolve there; delete that version first")
        return True

    @contextlib.contextmanager
    def import_mode(self, subject: str) -> Iterator[None]:
        versions = self.send(subject_versions(subject))
        holds_versions = versions.status == 200 and bool(versions.body)
        self.expect(set_mode(subject, "IMPORT", force=holds_versions),
                    f"put subject {subject} in IMPORT mode (needed to keep fixed ids)")
        try:
            yield
        finally:
            self._reset_mode(subject)

    def _reset_mode(self, subject: str) -> None:
        answer = self.send(reset_mode(subject))
        if answer.status in _UNSUPPORTED:
            self.expect(set_mode(subject, "READWRITE"), f"put subject {subject} back in "
                        "READWRITE mode")
        elif not 200 <= answer.status < 300:
            raise SchemaRegistrationError(
                f"{self.url} refused to reset the mode of subject {subject}: {_message(answer)}")

    def register(self, item: Registration) -> None:
        answer = self.expect(register(item), f"register {item.subject} under id "
                             f"{item.schema_id}")
        given = answer.body.get("id") if isinstance(answer.body, dict) else None
        if given != item.schema_id:
            raise SchemaRegistrationError(
                f"{self.url} registered {item.subject} under id {given}, not "
                f"{item.schema_id}: it ignores IMPORT mode ids")


def _name_of(schema_text: str) -> str:
    try:
        document = json.loads(schema_text)
        return subject_of(document) if isinstance(document, dict) else "not a record"
    except (ValueError, KeyError):
        return "unreadable"


def register_schemas(
    registry_url: str, *, transport: Transport | None = None,
    registry: SchemaRegistry | None = None, progress: Progress | None = None,
) -> RegisterReport:
    """Register every journal schema under its fixed id; see the module docstring."""
    check_registry_url(registry_url)
    say = progress or (lambda _line: None)
    client = _Registry(registry_url, transport or UrllibTransport(registry_url))
    report = RegisterReport(registry_url)
    pending: dict[str, list[Registration]] = {}  # subject -> its missing versions, id order
    for item in registrations(registry):
        if client.in_place(item):
            report.unchanged.append(item)
        else:
            pending.setdefault(item.subject, []).append(item)
    for subject, items in pending.items():
        with client.import_mode(subject):
            for item in items:
                client.register(item)
                report.registered.append(item)
                say(f"registered id {item.schema_id}: {subject} ({item.record_type})")
    report.registered.sort(key=lambda r: r.schema_id)
    return report


def check_registry_url(url: str) -> str:
    """`url` if it is an http(s) URL with a host, else SchemaRegistrationError (one line,
    before any request)."""
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # (a port that is not a number raises here)
    except ValueError as exc:
        raise SchemaRegistrationError(f"schema registry URL {url!r} is not valid: {exc}"
                                      ) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SchemaRegistrationError(f"schema registry URL {url!r} is not an http:// or "
                                      f"https:// URL with a host (like {EXAMPLE_URL})")
    return url
