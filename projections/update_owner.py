"""The owner's side of updates (projections.updates): each pending update judged once a
lineage, and its verdict written to the round that holds the update. Pure.

A validator runs off the event loop, for up to its time limit, while the run goes on: a
lineage whose rounds hand off sooner than its validator answers carries the update on
before the verdict is applied. A verdict applied to a round that ended is ignored (the first
verdict applied stands, and an ended round takes none). Keyed by round, each next round ran
the validator again, its verdict reached an ended round again, and the update was never
judged: its caller was never answered while the lineage handed off, and each round held
another validator thread. So:
- an update is judged under a key of its lineage (`update_key`): one validation in flight
  for the whole lineage, whichever rounds it outlives;
- its verdict is written to the round that holds the update when the verdict is ready
  (`holder`), following the handoffs since the validation began;
- a verdict that still reaches a round that ended since it was written (its handoff was
  decided first) is written again, unchanged, to the round that holds the update then
  (`readdressed`): the validator does not run again.
"""

from __future__ import annotations

from collections.abc import Callable

from runstream.engine.journal import events as ev
from runstream.projections.reactions import OwnerView, Reaction, Validate, Write
from runstream.projections.state import InboxItem, RunState
from runstream.projections.updates import pending, rounds_after, verdict_body


def update_key(run: RunState, request_id: str) -> str:
    """The key an update is judged under: its lineage's (a handoff carries it on), not its
    round's."""
    return f"update/{run.lineage_id}/{request_id}"


def judge_updates(view: OwnerView, run: RunState) -> list[Reaction]:
    """The run's pending updates, each once per ownership and lineage: accepted at once
    when the flow has no validator for it, else validated (Validate); none while the run's
    flow is not registered here (an owner that registers it judges them)."""
    flow = view.flows.get(run.flow)
    if flow is None or run.status.is_terminal:
        return []
    reactions: list[Reaction] = []
    for item in pending(run):
        key = update_key(run, item.request_id)
        if key in view.decided:  # (being validated, or its verdict is on its way)
            continue
        if flow.validator_for(item.name or "") is None:
            reactions.append(Write(run, (verdict_body(item, None),), key))
        else:
            reactions.append(Validate(run, item, key))
    return reactions


def holder(run: RunState, request_id: str, run_of: Callable[[str], RunState | None]
           ) -> tuple[RunState, InboxItem] | None:
    """The round of `run`'s lineage that holds the update waiting for its verdict, with its
    item: `run` itself, or the round its handoffs carried the update to (None: no round
    that has not ended holds it: it was judged, or refused when its lineage ended)."""
    for held in (run, *rounds_after(run, run_of)):
        if held.status.is_terminal:
            continue
        item = next((i for i in pending(held) if i.request_id == request_id), None)
        return None if item is None else (held, item)
    return None


def verdict_write(view: OwnerView, validate: Validate, reason: str | None) -> list[Reaction]:
    """The validator's verdict (`reason`, None: accepted), to the round that holds the
    update now (nothing when the validated round is gone)."""
    latest = view.run(validate.run.run_id)  # (as it stands now)
    if latest is None:
        return []
    held = holder(latest, validate.item.request_id, view.run)
    if held is None:
        return []
    round_, item = held
    return [Write(round_, (verdict_body(item, reason),), validate.key)]


def readdressed(view: OwnerView, run: RunState, record: ev.JournalRecord) -> list[Reaction]:
    """A verdict applied to a round that had ended since it was written: the same verdict,
    to the round that holds the update now (nothing when none does)."""
    if not isinstance(record, ev.UpdateAccepted | ev.UpdateRejected):
        return []
    request_id = record.envelope.request_id
    if request_id is None or not run.status.is_terminal or run.handed_off_to is None:
        return []
    held = holder(run, request_id, view.run)
    if held is None:
        return []
    round_, item = held
    reason = record.reason if isinstance(record, ev.UpdateRejected) else None
    return [Write(round_, (verdict_body(item, reason),), update_key(round_, request_id))]
