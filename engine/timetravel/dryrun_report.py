"""The decisions a dry run compares, described for people: a journal entry, a call the new
code makes, a record it would send, a wait it would suspend on, or how a run ends
(engine/timetravel/dryrun.py compares them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runstream.engine.flow.context import StepArguments
from runstream.engine.journal import JournalRecord
from runstream.engine.journal import events as ev
from runstream.engine.journal.timetext import iso_time
from runstream.projections.state import JournalEntry, RunState, RunStatus, Wait
from runstream.projections.transitions import RETRY_WAIT
from runstream.projections.updates import event_words

PREVIEW = 80  # characters of arguments, results and payloads shown to people


@dataclass(frozen=True, slots=True)
class Decision:
    """One decision of the original run or of the new code: at a journal position (a step,
    a wait, a spawn, a journaled value) or how the run ends (kind in ENDINGS)."""

    kind: str  # step sleep wait spawn child now uuid patch | completed failed cancelled ...
    text: str  # for people: what it is ("step 'charge'(args 1f2e...) at position 2")
    action: str  # for people: what doing it means ("run step 'charge'(...) at position 2")
    name: str = ""
    position: int | None = None
    args_digest: str | None = None
    value: str | None = None  # what endings compare: result, error, handoff; None: unknown
    arguments: str | None = None  # a step call's arguments, shortened for people

    @property
    def is_ending(self) -> bool:
        return self.kind in ENDINGS



def original_ending(run: RunState, next_round: RunState | None = None) -> Decision | None:
    """How the run ended (or stands quarantined); None while it has more to decide (pending,
    running, or suspended on a wait, whose open journal entry is its decision)."""
    if run.status is RunStatus.completed and run.handed_off_to is not None:
        if next_round is None:  # not in the read model: compared by status alone
            return _ending("handed-off", f"round {run.handed_off_to!r}", None)
        return _handed_off(next_round.flow, next_round.payload_json)
    if run.status is RunStatus.completed:
        return _ending("completed", _short(run.result_json or "null"), run.result_json)
    if run.status is RunStatus.failed:
        return _failure(run.error_type or "Error", run.error_message or "")
    if run.status is RunStatus.cancelled:
        return _ending("cancelled", "", None)
    if run.wait is not None and run.wait.kind == "quarantine":
        return _ending("quarantined", str(run.wait.position), str(run.wait.position))
    return None


def ending_of(cls: type[JournalRecord], body: dict[str, Any]) -> Decision | None:
    """The ending a settlement record the handler's runner sends means (None: not one)."""
    if cls is ev.RunCompleted:
        return _ending("completed", _short(body["result_json"]), body["result_json"])
    if cls is ev.RunFailed:
        return _failure(body["error_type"], body.get("error_message") or "")
    if cls is ev.LineageExhausted:
        return _failure("LineageExhausted", f"the budget of {body['budget']} rounds is used")
    if cls is ev.RoundInvalid:
        return _failure("RoundInvalid", body["reason"])
    if cls is ev.RunCancelled:
        return _ending("cancelled", "", None)
    if cls is ev.RunHandedOff:
        return _handed_off(body["flow"], body["payload_json"])
    if cls is ev.RunSuspended and body.get("reason") == "quarantine":
        return _ending("quarantined", str(body.get("position")), str(body.get("position")))
    return None  # evidence, a child policy: they go with the ending, not instead of it


# How each ending reads: (as what the run did, as what the code would do) + its detail.
_ENDING_WORDS = {
    "completed": ("completed with result ", "complete the run with result "),
    "failed": ("failed with ", "fail the run with "),
    "cancelled": ("cancelled", "cancel the run"),
    "handed-off": ("handed off to ", "hand off to "),
    "quarantined": ("quarantined at position ", "quarantine the run at position "),
}
ENDINGS = frozenset(_ENDING_WORDS)


def _ending(kind: str, shown: str, value: str | None, name: str = "") -> Decision:
    done, to_do = _ENDING_WORDS[kind]
    return Decision(kind, done + shown, to_do + shown, name, value=value)


def _failure(error_type: str, message: str) -> Decision:
    # Lineage exhaustion is compared by its type: its message is the reducer's wording.
    value = error_type if error_type == "LineageExhausted" else f"{error_type}: {message}"
    return _ending("failed", _short(f"{error_type}: {message}"), value, error_type)


def _handed_off(flow: str, payload_json: str) -> Decision:
    shown = f"flow {flow!r} with payload {_short(payload_json)}"
    return _ending("handed-off", shown, f"{flow} {payload_json}", flow)


def entry_decision(entry: JournalEntry) -> Decision:
    """A journal entry as the original run's decision at its position."""
    return call_decision(entry.kind, entry.name, entry.position, entry.args_digest, None)


def call_decision(kind: str, name: str, position: int, digest: str | None,
          preview: str | None) -> Decision:
    """A call at a position, as the handler made it (or the journal holds it)."""
    at = f"at position {position}"
    if kind == "step":
        args = "" if digest is None else f"args {digest}" + (f": {preview}" if preview else "")
        text = f"step {name!r}({args}) {at}"
        return Decision(kind, text, f"run {text}", name, position, digest, arguments=preview)
    text = {
        "sleep": f"sleep {at}", "wait": f"wait for {event_words(name)} {at}",
        "spawn": f"spawn of flow {name!r} {at}", "child": f"wait for child {name!r} {at}",
        "now": f"journaled time {at}", "uuid": f"journaled uuid {at}",
        "patch": f"patch marker {name!r} {at}",
    }.get(kind, f"{kind} {name!r} {at}")
    return Decision(kind, text, text, name, position)


def sent_intent(call: Decision | None, cls: type[JournalRecord],
                 body: dict[str, Any]) -> Decision:
    """The new decision a positional record stands for, with what the record says."""
    position = body.get("position")
    kind = call.kind if call is not None else body.get("kind", "step")
    name = call.name if call is not None else body.get("name", "")
    if cls is ev.ChildSpawned:
        what = (f"spawn child {body['child_run_id']!r} of flow {body['flow']!r} with "
                f"payload {_short(body['payload_json'])}")
    elif cls is ev.RunResumed:
        what = (f"take the buffered {event_words(name)}"
                if body.get("signal_request_id") is not None
                else f"take the outcome of child {name!r}" if body.get("reason") == "child"
                else f"time out waiting for {event_words(name)}")
    else:
        what = {"sleep": "go past the sleep (its time has come)",
                "patch": f"write patch marker {name!r} (the new branch)",
                "now": "journal a new time", "uuid": "journal a new uuid",
                }.get(kind, f"journal {cls.TYPE} for {name!r}")
    action = f"{what} at position {position}"
    return Decision(kind, action, action, name, position)


def wait_intent(call: Decision | None, wait: Wait) -> Decision:
    """A wait the handler would suspend on."""
    at = f"at position {wait.position}"
    due = "" if wait.due_ms is None else _iso(wait.due_ms)
    if wait.kind == "timer":
        action = f"sleep until {due} {at}"
    elif wait.kind == "event":
        timeout = f" (timeout {due})" if due else ""
        action = f"wait for {event_words(wait.event_name or '')}{timeout} {at}"
    elif wait.kind == RETRY_WAIT:  # (its step's durable backoff: "child None" before)
        action = f"wait out a retry backoff until {due} {at}"
    else:
        timeout = f" (timeout {due})" if due else ""
        action = f"wait for child {wait.child_run_id!r}{timeout} {at}"
    kind = call.kind if call is not None else wait.kind
    name = call.name if call is not None else ""
    return Decision(kind, action, action, name, wait.position)


def arguments_preview(arguments: StepArguments) -> str:
    args, kwargs = arguments
    parts = [repr(value) for value in args]
    parts += [f"{key}={value!r}" for key, value in kwargs.items()]
    return _short(", ".join(parts))


def _short(text: str, limit: int = PREVIEW) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _iso(millis: int) -> str:
    return iso_time(millis, precision="s", zone="+00:00")
