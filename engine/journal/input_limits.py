"""Input limits: what a run id, a flow or signal name and a payload may be.

Checked where input enters (the client API, the CLI before it connects), so an invalid
request is refused with one clear line and never produced. The rules keep every id the
engine derives itself valid:

- a round's run id is `<lineage>~<n>` (`~`, ROUND_SEPARATOR), a child's default id is
  `<parent>.<position>`, a generated fork id is `<source>-fork-<8 hex>` (its `~` written as
  `-round-`): all inside RUN_ID_CHARS;
- a run id a client chooses is at most MAX_RUN_ID_CHARS, but a derived id grows by one
  `.<position>` per level of children (MAX_DEPTH 64 levels) and by `~<n>` per round, so
  ids that name an existing run are accepted up to MAX_ADDRESSED_RUN_ID_CHARS.
"""

from __future__ import annotations

import os
import re

from runstream.engine.errors import InvalidInput, InvalidRunId, PayloadInvalid, RunstreamError
from runstream.engine.journal import MAX_RECORD_BYTES as MAX_RECORD_BYTES  # re-exported
from runstream.engine.journal import JournalRecord, encode
from runstream.engine.journal.settings import env_count

RUN_ID_CHARS = "A-Za-z0-9._:~@/+=-"
NAME_CHARS = "A-Za-z0-9._:-"
MAX_RUN_ID_CHARS = 200  # a run id a client chooses (create, fork --as)
# Any run id, derived ones included: 64 levels of `.<position>` plus rounds fit easily.
MAX_ADDRESSED_RUN_ID_CHARS = 1024
MAX_NAME_CHARS = 128  # flow names and signal (event) names
MAX_TEXT_CHARS = 4096  # free text a request carries (a cancel's reason)
# A run's timeout (a flow's, or the one its creator asks for): a century at most, so that its
# deadline is a time the journal's text can show (years 1 to 9999).
MAX_TIMEOUT_MS = 100 * 365 * 24 * 3600 * 1000
DEFAULT_MAX_PAYLOAD_BYTES = 512 * 1024
PAYLOAD_ENV = "RUNSTREAM_MAX_PAYLOAD_BYTES"

_RUN_ID = re.compile(f"[{RUN_ID_CHARS}]+")
_NAME = re.compile(f"[{NAME_CHARS}]+")
_AUTHORITY_NAME = re.compile(r"[A-Za-z0-9_-]{1,100}")  # it ends a topic name
AUTHORITY_NAME_ENV = "RUNSTREAM_AUTHORITY_NAME"


class RunIdInvalid(InvalidInput, InvalidRunId):
    """A run id outside the rules above."""


class NameInvalid(InvalidInput):
    """A flow or signal name outside the rules above."""


class PayloadTooLarge(InvalidInput, PayloadInvalid):
    """A payload (or a step result given by an operator) over MAX_PAYLOAD_BYTES encoded."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        detail = (f"{size} bytes of JSON, over the {limit}-byte limit ({PAYLOAD_ENV}); "
                  f"pass a reference (a URL, an object-store key) instead")
        RunstreamError.__init__(self, f"{what} is {detail}")
        self.flow = ""
        self.detail = detail
        self.size = size
        self.limit = limit


class RecordTooLarge(InvalidInput):
    """A request that would not fit one journal record once encoded."""


def max_payload_bytes() -> int:
    """RUNSTREAM_MAX_PAYLOAD_BYTES, else 512 KiB; never above what one record can carry."""
    return env_count(PAYLOAD_ENV, DEFAULT_MAX_PAYLOAD_BYTES, unit="bytes", minimum=1,
                     maximum=MAX_RECORD_BYTES)


def check_run_id(run_id: str, *, new: bool = False) -> str:
    """`run_id` if valid, else RunIdInvalid. `new`: an id a client chooses for a new run
    (at most MAX_RUN_ID_CHARS, and no `~`, which names a lineage's rounds)."""
    limit = MAX_RUN_ID_CHARS if new else MAX_ADDRESSED_RUN_ID_CHARS
    if not isinstance(run_id, str) or not run_id:
        raise RunIdInvalid("a run id must be a non-empty string")
    if len(run_id) > limit:
        raise RunIdInvalid(f"run id {shown(run_id)} is {len(run_id)} characters, over the "
                           f"{limit} allowed")
    if not _RUN_ID.fullmatch(run_id):
        raise RunIdInvalid(f"run id {shown(run_id)} has {_bad_chars(run_id, _RUN_ID)}: "
                           f"use only letters, digits and . _ : ~ @ / + = -")
    if new and "~" in run_id:
        raise RunIdInvalid(f"run id {shown(run_id)} contains '~', which names the rounds "
                           f"of a lineage (`<lineage>~<n>`)")
    return run_id


def check_name(kind: str, name: str) -> str:
    """A flow or signal name (`kind` says which, for the message), or NameInvalid."""
    label = kind if kind.endswith(" id") else f"{kind} name"  # ("schedule id name" read odd)
    if not isinstance(name, str) or not name:
        raise NameInvalid(f"a {label} must be a non-empty string")
    if len(name) > MAX_NAME_CHARS:
        raise NameInvalid(f"{label} {shown(name)} is {len(name)} characters, over the "
                          f"{MAX_NAME_CHARS} allowed")
    if not _NAME.fullmatch(name):
        raise NameInvalid(f"{label} {shown(name)} has {_bad_chars(name, _NAME)}: use "
                          f"only letters, digits and . _ : -")
    return name


def check_authority_name(name: str) -> str:
    """An authority's name: it names the topic `<namespace>.requests.<authority>`."""
    if not isinstance(name, str) or not _AUTHORITY_NAME.fullmatch(name):
        raise NameInvalid(f"authority name {shown(str(name))} must be 1..100 letters, "
                          f"digits, _ or - (it names the topic <namespace>.requests.<name>)")
    return name


def resolve_authority_name(explicit: str | None = None) -> str | None:
    """The client's authority name: keyword, else RUNSTREAM_AUTHORITY_NAME, else None."""
    name = explicit or os.environ.get(AUTHORITY_NAME_ENV, "").strip() or None
    return None if name is None else check_authority_name(name)


def check_payload(what: str, payload_json: str) -> str:
    """`payload_json` if its UTF-8 encoding fits max_payload_bytes(), else PayloadTooLarge."""
    limit = max_payload_bytes()
    if len(payload_json) > limit:  # every character takes at least one byte: skip encoding
        raise PayloadTooLarge(what, len(payload_json.encode("utf-8", "surrogatepass")), limit)
    size = len(payload_json.encode("utf-8", "surrogatepass"))
    if size > limit:
        raise PayloadTooLarge(what, size, limit)
    return payload_json


def check_text(what: str, text: str, limit: int = MAX_TEXT_CHARS) -> str:
    """Free text a request carries (a cancel's reason, a request id): a str of at most
    `limit` characters that UTF-8 can encode (no lone surrogate, as undecodable bytes in
    argv become), else InvalidInput."""
    if not isinstance(text, str):
        raise InvalidInput(f"{what} must be a string, not {type(text).__name__}")
    if len(text) > limit:
        raise InvalidInput(f"{what} is {len(text)} characters, over the {limit} allowed")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(f"{what} {shown(text)} holds {text[exc.start]!r} at character "
                           f"{exc.start}, a lone surrogate UTF-8 cannot encode") from None
    return text


def check_request_id(request_id: str) -> str:
    """A request id a caller chose: check_text's, and not empty (an empty one stood for no
    id at all: each send got a random one, and a retry the caller meant to dedupe applied
    twice)."""
    check_text("a request id", request_id, MAX_NAME_CHARS)
    if not request_id:
        raise InvalidInput("a request id must not be empty (leave it out for a new one)")
    return request_id


def encode_request(record: JournalRecord, key: bytes,
                   extra_headers: list[tuple[str, bytes]] | None = None,
                   ) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The record's value and headers, or RecordTooLarge when value, key and headers
    together exceed MAX_RECORD_BYTES: nothing that large is ever produced."""
    value, headers = encode(record)
    headers = [*headers, *(extra_headers or [])]
    size = len(value) + len(key) + sum(len(k) + len(v) for k, v in headers)
    if size > MAX_RECORD_BYTES:
        raise RecordTooLarge(f"{record.TYPE} for run {shown(record.envelope.run_id)} is "
                             f"{size} bytes encoded, over the {MAX_RECORD_BYTES}-byte limit "
                             f"of one journal record")
    return value, headers


def shown(text: str, limit: int = 60) -> str:
    """A possibly huge or hostile value, quoted and cut for an error line."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} chars)"


def _bad_chars(text: str, allowed: re.Pattern[str]) -> str:
    bad = sorted({c for c in text if not allowed.fullmatch(c)})
    shown = ", ".join(repr(c) for c in bad[:5]) + (", ..." if len(bad) > 5 else "")
    return f"characters that are not allowed ({shown})"
