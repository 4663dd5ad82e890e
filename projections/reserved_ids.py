"""Run ids and request ids a restricted authority may not take (engine.worker.relay_judge
refuses them; a Client of that authority says so before it sends one). Pure.

Each is predictable and made later by the engine itself, for runs the authority need not
cover: taken first, it cost a schedule that instant's run, failed a parent's spawn, or made
an owner's own request a duplicate (`request-id-reused`), so that the fire, the spawn or
the wake it carried never happened.
"""

from __future__ import annotations

import re

from runstream.engine.journal import events as ev

# The ids of the runs a schedule starts: `<schedule>@<instant>`, `<schedule>@trigger/<id>`.
_FIRE_ID = re.compile(r"[^@]+@(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z|trigger/.+)")


# A child's default id: its parent's id with the parent's incarnation, then the spawn's
# position (`<parent>@<incarnation>.<position>`), predictable as a fire's.
_CHILD_ID = re.compile(r".+@\d+\.\d+")
# The request ids an owner gives the requests it sends (projections.outbox_requests, a fire,
# a handoff, a fork's parts): one a client spent first on its partition made the owner's a
# duplicate, rejected (`request-id-reused`), and the spawn, fire or wake it was never happened.
# (A client's fork request is `fork/<new run>/<random>`: its own, and no one can guess it.)
OWNER_REQUEST_PREFIXES = ("cancel/", "fire/", "handoff/", "settled/", "spawn/", "wake/")


def fire_id_refusal(run_id: str, authority: str | None) -> str | None:
    """Why a restricted `authority` may not create `run_id` (None: it may, or no authority
    restricts it): the shape of a schedule's fired run, or of a child's default id,
    predictable, which taken first cost the schedule that instant's run (failed the parent's
    spawn). The relay refuses it (a fork's new run too); the client says so at once."""
    if authority is None:
        return None
    if _FIRE_ID.fullmatch(run_id) is not None:
        return (f"run id {run_id!r} has the shape of a schedule's fired run "
                f"(`<schedule>@<instant>`): authority {authority!r} may not create it")
    if _CHILD_ID.fullmatch(run_id) is not None:
        return (f"run id {run_id!r} has the shape of a child run's "
                f"(`<parent>@<incarnation>.<position>`): authority {authority!r} may not "
                f"create it")
    return None


def relay_refusal(record: ev.JournalRecord, authority: str | None) -> str | None:
    """Why a restricted `authority` may not send `record` (a request) at all: a run id a
    schedule or a parent will create (a create's, a signal-with-start's, a fork's new
    run's), or a request id an owner gives its requests. The relay refuses it; a Client of
    that authority says so before it sends it (it waited for the relay, and said "is a
    worker up?")."""
    if (authority is not None and isinstance(record, ev.RunResumeRequested)
            and record.resolution is not None):
        return (f"not allowed: resolving a quarantine ({record.resolution}) says whether an "
                f"irreversible effect happened, an operator's request, not {authority!r}'s")
    target = (record.target_run_id if isinstance(record, ev.RunForkRequested)
              else record.envelope.run_id
              if isinstance(record, ev.RunCreateRequested | ev.RunSignalWithStartRequested)
              else None)
    return ((None if target is None else fire_id_refusal(target, authority))
            or owner_request_id_refusal(record.envelope.request_id, authority))


def owner_request_id_refusal(request_id: str | None, authority: str | None) -> str | None:
    """Why a restricted `authority` may not send a request under `request_id`: it starts
    as the request ids owners give theirs (OWNER_REQUEST_PREFIXES)."""
    if authority is None or not request_id or not request_id.startswith(OWNER_REQUEST_PREFIXES):
        return None
    return (f"request id {request_id!r} starts as the ids the engine gives its own requests "
            f"({', '.join(OWNER_REQUEST_PREFIXES)}): authority {authority!r} may not use it")
