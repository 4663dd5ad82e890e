"""The lookups the CLI, the UI and the dry run share: open a namespace's read model, catch up
the partition a run id names, and resolve which run a query naming a lineage is about."""

from __future__ import annotations

from pathlib import Path

from runstream.engine.config import journal_topic, resolve_bootstrap, resolve_namespace
from runstream.engine.errors import RunExpired, RunNotFound
from runstream.engine.journal import DecodeError, decode
from runstream.engine.journal import events as ev
from runstream.engine.kafka.connection import KafkaSecurity
from runstream.engine.readmodel.model import ReadModel
from runstream.engine.readmodel.view import View
from runstream.projections.decide import rejection_why
from runstream.projections.expiry import expired_error
from runstream.projections.partitioning import run_partition
from runstream.projections.request_reuse import reused_not_found
from runstream.projections.state import RunState, Tombstone, round_zero


def read_model_of(bootstrap: str | None, namespace: str | None,
                  read_model_dir: Path | None, *, security: KafkaSecurity | None = None
                  ) -> ReadModel:
    """The namespace's read model (default directory: model.default_read_model_dir);
    `security` None: SASL/TLS settings from the RUNSTREAM_* environment (the CLI sets it)."""
    return ReadModel(bootstrap=resolve_bootstrap(bootstrap),
                     topic=journal_topic(resolve_namespace(namespace)), path=read_model_dir,
                     security=security)


def _known(view: View, run_id: str) -> bool:
    return view.run(run_id) is not None or bool(view.history(run_id))


async def view_of(model: ReadModel, run_id: str, *, records: bool = False) -> View:
    """Catch up the run's partition; a run not routed by its own id (a later round of a
    lineage) is looked for after catching up every partition. RunExpired if it expired
    (requests refused since still leave history: the tombstone is looked at first),
    RunNotFound if the journal holds no record of it. `records`: with the bytes of the
    run's records (what its history rows and replays decode; ReadModel.complete)."""
    view = await model.catch_up([run_partition(run_id, model.partitions)])
    stone = view.tombstone(run_id) if view.run(run_id) is None else None
    if stone is not None:
        raise expired_error(stone)
    if not _known(view, run_id):
        view = await model.catch_up()
        if not _known(view, run_id):  # (why, when a create of it was rejected)
            raise await missing_run(model, view, run_id, None)
    return await model.complete(view, [run_id]) if records else view


def addressed_run(view: View, run_id: str) -> str:
    """The run a query naming `run_id` is about: `<lineage>~0` is round 0 (the lineage id),
    a lineage id names its latest round, any other id names itself (as Client.describe)."""
    named = round_zero(run_id)
    return named if named != run_id else view.addressed(run_id)


async def addressed(model: ReadModel, run_id: str, *, records: bool = False
                    ) -> tuple[View, RunState]:
    """The view caught up for the run a query naming `run_id` is about (addressed_run), and
    that run's state: what `run status` and the dry run start from. RunExpired if it
    expired (a lineage's id: its final round's tombstone), RunNotFound if none."""
    view, found = await addressed_or_expired(model, run_id, records=records)
    if not isinstance(found, RunState):
        raise expired_error(found)
    return view, found


async def addressed_or_expired(model: ReadModel, run_id: str, *, records: bool = False
                               ) -> tuple[View, RunState | Tombstone]:
    """As `addressed`, or, for a run that expired, its tombstone (View.expired: a lineage's
    id reaches its final round's); RunNotFound if there is neither. `records`: as view_of,
    for the run reached."""
    try:
        view = await view_of(model, round_zero(run_id))
    except RunExpired:
        view = await model.catch_up([run_partition(run_id, model.partitions)])
        stone = view.expired(run_id)
        if stone is None:
            raise
        return view, stone
    run = view.run(addressed_run(view, run_id))
    if run is not None:
        return (await model.complete(view, [run.run_id]) if records else view), run
    stone = view.expired(run_id)
    if stone is None:
        raise await missing_run(model, view, run_id, None)
    return view, stone


async def missing_run(model: ReadModel, view: View, run_id: str, stone: Tombstone | None
                      ) -> RunNotFound:
    """What answers a query about a run `view` does not hold: RunExpired (its tombstone),
    else RunNotFound, saying why its create was rejected when the journal rejected one (a
    plain producer's create: no client was there to raise CreateRejected)."""
    if stone is not None:
        return expired_error(stone)
    exact = round_zero(run_id)
    if not any(item.type == ev.RunCreateRejected.TYPE for item in view.history(exact)):
        reused = view.reuse_rejection(exact)  # (a create that repeated a request id)
        return RunNotFound(run_id) if reused is None else reused_not_found(run_id, *reused)
    record = rejection_in(await model.complete(view, [exact]), exact)
    return RunNotFound(run_id, rejected=None if record is None else rejection_why(record))


def rejection_in(view: View, run_id: str, request_id: str | None = None
                 ) -> ev.RunCreateRejected | None:
    """The latest rejection of a create of `run_id` among its records in `view` (with their
    bytes: ReadModel.complete), of the create `request_id` when given; what
    engine.testing.upkeep.rejected_create finds in the environment."""
    for item in reversed(view.history(run_id)):
        if item.type != ev.RunCreateRejected.TYPE or item.raw is None:
            continue
        try:
            record = decode(item.raw)
        except DecodeError:
            continue
        if isinstance(record, ev.RunCreateRejected) and request_id in (
                None, record.envelope.request_id):
            return record
    return None
