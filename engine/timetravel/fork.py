"""Fork a run: a new run whose journal starts as a copy of another run's first entries.

`fork_run` (behind `runstream run fork ID --at record:K [--as NEW_ID] [--force]`) reads the
source's history from the read model and plans the fork there (projections.fork_plan) to
refuse early what its owner would refuse: a row past the history, a run that did not exist
at that row, a target id taken, residue without `force`. History row K counts from 1,
requests and fenced records included, as `run history` prints them.

The fork is then ONE request to the SOURCE run's partition: the source run, the point (row
K and its offset) and the new run's id, and no journal content, so a principal that may
only send requests cannot put a forged entry (a step "completed" with any result) in
anyone's journal. The source's owner reads the prefix from its own journal and sends it, in
parts under the record size limit, to the new run's partition (projections.fork_transitions); the
new run's owner copies it as its own decisions; the run then replays the prefix, executing
nothing in it, and goes on live from there. `fork_run` waits for that answer (`wait`), which
needs a worker, and raises ForkRefused with the owner's reason when it refuses.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runstream.engine.client.client import Client, requester
from runstream.engine.errors import RunNotFound, RunstreamError
from runstream.engine.journal import decode
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import check_run_id
from runstream.engine.readmodel.lookups import view_of
from runstream.engine.readmodel.model import ReadModel
from runstream.engine.readmodel.view import View
from runstream.projections.fork_plan import (
    ForkNeedsForce,
    ForkTargetExists,
    fork_request,
    fork_run_id,
    later_rounds,
    part_bodies,
    plan_fork,
)
from runstream.projections.partitioning import run_partition
from runstream.projections.requests import describe_refusal
from runstream.projections.state import RunState, Verdict, round_zero

ANSWER_TIMEOUT = 60.0  # how long fork_run waits for the owners (a worker must be up)
_POLL_SECONDS = 0.2


class ForkRefused(RunstreamError):
    """The fork request was refused: by the reducer (an authority that does not cover the
    source run) or by the source's owner (its reason: the point is not in the run's
    history, residue without --force, a part too large...)."""

    def __init__(self, run_id: str, reason: str) -> None:
        super().__init__(f"fork of run {run_id} refused: {reason}")
        self.run_id = run_id
        self.reason = reason


class ForkNotAnswered(RunstreamError):
    """The fork request is in the journal, but its owners have not answered it in time."""


@dataclass(frozen=True, slots=True)
class ForkResult:
    """A fork request sent: the new run exists once its owner admits it."""

    run_id: str
    source_run_id: str
    at_record: int
    source_offset: int
    flow: str
    entries: int  # journal entries copied (the prefix's length)
    parts: int  # records the prefix travels in (owner to owner)
    partition: int  # the new run's
    request_partition: int  # the fork request's: the source run's partition
    request_offset: int  # the fork request's offset there
    forced: bool
    warnings: tuple[str, ...]
    answered: bool  # the new run exists (False: sent with wait=False)

    def as_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "source_run_id": self.source_run_id,
                "at_record": self.at_record, "source_offset": self.source_offset,
                "flow": self.flow, "entries": self.entries, "parts": self.parts,
                "partition": self.partition, "request_partition": self.request_partition,
                "request_offset": self.request_offset, "forced": self.forced,
                "warnings": list(self.warnings), "answered": self.answered}


async def fork_run(
    *, bootstrap: str | None, namespace: str | None, run_id: str, at_record: int,
    new_run_id: str | None, force: bool, read_model_dir: Path | None = None,
    wait: bool = True, timeout: float = ANSWER_TIMEOUT, client: Client | None = None,
) -> ForkResult:
    """Fork `run_id` at history row `at_record` into `new_run_id` (None: a generated id).
    `wait`: return once the new run exists (else once the source's partition took the
    request); `client`: send through it (its security and authority) instead of a new one.

    Raises RunNotFound, InvalidInput (a row past the history), RunAbsentAt (the run did not
    exist yet at that row), InvalidRunId, ForkTargetExists, ForkNeedsForce (residue without
    `force`; its `warnings` list each effect), ForkTooLarge, ForkRefused and
    ForkNotAnswered (no answer within `timeout` seconds: is a worker up?)."""
    run_id = round_zero(check_run_id(run_id))  # `<lineage>~0` names round 0 itself
    target = fork_run_id(run_id, new_run_id)
    if client is None:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          read_model_dir=read_model_dir) as own:
            return await _fork(own, run_id, at_record, target, force, wait, timeout)
    return await _fork(client, run_id, at_record, target, force, wait, timeout)


async def _fork(client: Client, run_id: str, at_record: int, target: str, force: bool,
                wait: bool, timeout: float) -> ForkResult:
    model = await client.read_model()
    view = await view_of(model, run_id, records=True)
    plan = plan_fork(run_id, view.history(run_id), at_record, view.entries(run_id), view=view,
                     later=later_rounds(view.run(run_id), view.run, view.entries))
    if plan.warnings and not force:
        raise ForkNeedsForce(run_id, at_record, plan.warnings)
    client.check_authority(plan.source)  # (the reducer checks the relayed authority)
    partition = run_partition(target, model.partitions)
    held = await model.catch_up([partition])
    if held.run(target) is not None or held.expired(target) is not None:
        # (an expired one's tombstone refuses the fork's first part: nothing was made)
        raise ForkTargetExists(target, expired=held.run(target) is None)
    who = requester()
    # `force` as the user gave it: the owner judges the source as it is when the request
    # applies, which may hold an irreversible step this read did not see yet.
    parts = len(part_bodies(plan, target, forced=force, requested_by=who))
    request = fork_request(plan, target, forced=force, requested_by=who)
    [(source_partition, offset)] = await client.send_requests([request])
    answer = await client.answer(request, source_partition, offset)
    if answer.run_missing:
        raise RunNotFound(run_id)
    if answer.verdict is Verdict.refused:
        raise ForkRefused(run_id, describe_refusal(answer.run, answer.record))
    if wait:
        made = await _answered(model, request, source_partition, partition, timeout)
        parts = made.fork.parts if made.fork is not None else parts  # the owner's count
    return ForkResult(run_id=target, source_run_id=run_id, at_record=at_record,
                      source_offset=plan.source_offset, flow=plan.source.flow,
                      entries=len(plan.prefix), parts=parts, partition=partition,
                      request_partition=source_partition, request_offset=offset,
                      forced=bool(plan.warnings), warnings=plan.warnings, answered=wait)


async def _answered(model: ReadModel, request: ev.RunForkRequested, source_partition: int,
                    partition: int, timeout: float) -> RunState:
    """Wait until the new run exists, made from this request's part 0; raise the owner's
    refusal, ForkTargetExists (made meanwhile by someone else) or ForkNotAnswered."""
    source, target = request.source_run_id, request.target_run_id or ""
    request_id = request.envelope.request_id
    deadline = time.monotonic() + timeout
    while True:
        view = await model.catch_up(sorted({source_partition, partition}))
        made = view.run(target)
        if made is not None:
            if made.request_id != f"{request_id}/0":
                raise ForkTargetExists(target)
            return made
        refusal = _refusal(view, source, request_id)
        if refusal is not None:
            raise ForkRefused(source, refusal)
        if time.monotonic() > deadline:
            raise ForkNotAnswered(
                f"the fork of {source} as {target} is in the journal, but its owners have not "
                f"answered within {timeout:g}s: is a worker up? (it is answered when one is)")
        await asyncio.sleep(_POLL_SECONDS)


def _refusal(view: View, source: str, request_id: str | None) -> str | None:
    """The reason of the source owner's refusal of this request, if it refused it."""
    for item in reversed(view.history(source)):
        if item.type != ev.RunForkAnswered.TYPE or item.raw is None:
            continue
        record = decode(item.raw)
        if (isinstance(record, ev.RunForkAnswered) and record.refused is not None
                and record.envelope.request_id == request_id):
            return record.refused
    return None


