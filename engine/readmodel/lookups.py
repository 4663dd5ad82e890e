"""The lookups the CLI, the UI and the dry run share: open a namespace's read model, catch up
the partition a run id names, and resolve which run a query naming a lineage is about."""

from __future__ import annotations

from pathlib import Path

from runstream.engine.config import journal_topic, resolve_bootstrap, resolve_namespace
from runstream.engine.errors import RunNotFound
from runstream.engine.kafka.connection import KafkaSecurity
from runstream.engine.readmodel.model import ReadModel
from runstream.engine.readmodel.view import View
from runstream.projections.partitioning import run_partition
from runstream.projections.state import RunState, round_zero


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


async def view_of(model: ReadModel, run_id: str) -> View:
    """Catch up the run's partition; a run not routed by its own id (a later round of a
    lineage) is looked for after catching up every partition. RunNotFound if the journal
    holds no record of it."""
    view = await model.catch_up([run_partition(run_id, model.partitions)])
    if not _known(view, run_id):
        view = await model.catch_up()
        if not _known(view, run_id):
            raise RunNotFound(run_id)
    return view


def addressed_run(view: View, run_id: str) -> str:
    """The run a query naming `run_id` is about: `<lineage>~0` is round 0 (the lineage id),
    a lineage id names its latest round, any other id names itself (as Client.describe)."""
    named = round_zero(run_id)
    return named if named != run_id else view.addressed(run_id)


async def addressed(model: ReadModel, run_id: str) -> tuple[View, RunState]:
    """The view caught up for the run a query naming `run_id` is about (addressed_run), and
    that run's state: what `run status` and the dry run start from. RunNotFound if none."""
    view = await view_of(model, round_zero(run_id))
    run = view.run(addressed_run(view, run_id))
    if run is None:
        raise RunNotFound(run_id)
    return view, run
