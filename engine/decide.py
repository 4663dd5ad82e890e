"""Pure decision logic of a partition owner: no I/O, no clock.

Given projected state and a request, say what the owner decides. The worker turns these
answers into journal records.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from projections.state import InboxItem, RunState, RunStatus

FLOW_NOT_REGISTERED = "flow-not-registered"


@dataclass(frozen=True, slots=True)
class Create:
    """Admit a new run."""


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The request repeats an existing run with the same identity: answer with that run."""

    request_offset: int


@dataclass(frozen=True, slots=True)
class Reject:
    reason: str
    field: str
    existing: str
    requested: str


CreateDecision = Create | Duplicate | Reject
PayloadCheck = Callable[[str, str], str | None]  # (flow, payload_json) -> error or None


def decide_create(
    run: RunState | None, request: InboxItem, check_payload: PayloadCheck
) -> CreateDecision:
    """Answer a create request, given the run as it stands (None: no such run yet).

    `run` may be the run this very request made (first request for the id); identity is
    then its own, and only the payload check can refuse it.
    """
    flow = request.flow or ""
    payload = request.payload_json or "null"
    if run is not None and run.request_id != request.request_id:
        if run.flow != flow:
            return Reject("identity-conflict", "flow", run.flow, flow)
        if run.payload_json != payload:
            return Reject("identity-conflict", "payload", run.payload_json, payload)
        if run.admitted:
            return Duplicate(run.request_offset)
        # Same identity as a first request not yet admitted: it gets the first one's answer,
        # which depends only on the payload check.
    error = check_payload(flow, payload)
    if error is not None:
        return Reject("payload-invalid", "payload", "", error)
    if run is not None and run.request_id != request.request_id:
        return Duplicate(run.request_offset)
    return Create()


@dataclass(frozen=True, slots=True)
class Activation:
    mode: str  # new | claimed | stolen | resumed
    evidence: str
    previous_owner: str | None
    previous_epoch: int | None


def plan_activation(run: RunState, owner_names: Callable[[str], str]) -> Activation:
    """Why this owner activates `run` now, as evidence an operator can read."""
    previous, epoch = run.owner_source, run.owner_epoch
    if run.activations == 0:
        return Activation("new", "first activation", None, None)
    who = f"{owner_names(previous)} (epoch {epoch})" if previous else "an earlier owner"
    if run.status is RunStatus.running:
        return Activation(
            "stolen",
            f"{who} left the run running without releasing it: its session expired, "
            f"it crashed or it was cut off; taking it over",
            previous,
            epoch,
        )
    if run.released_cause:
        return Activation(
            "claimed", f"{who} released the run ({run.released_cause})", previous, epoch
        )
    return Activation("resumed", f"resumed after {run.suspended_reason or 'suspension'}",
                      previous, epoch)


def needs_activation(run: RunState) -> bool:
    return run.admitted and run.status in (RunStatus.pending, RunStatus.running)


def unanswered_creates(run: RunState) -> list[InboxItem]:
    return [item for item in run.inbox if item.type == "run.create-requested"]


def flow_missing_message(flow: str, owner: str) -> str:
    return (
        f"no worker has claimed flow {flow!r}: the partition's owner {owner} does not "
        f"register it; start a worker whose flows include {flow!r}"
    )
