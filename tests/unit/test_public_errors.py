"""Every error a user's call can raise is importable from `runstream`: those of the engine's
errors module, and those the Client, its read model, the journal reader and time travel
raise (a read model still loading a snapshot says "query again in a moment": a user must be
able to catch that one alone)."""

from __future__ import annotations

import importlib
import inspect

import runstream
from runstream.engine.errors import RunstreamError

# The modules whose errors reach a user's call (the worker's own, WorkerFatal aside, stay in
# the worker: they stop it, and nothing catches them in an application).
USER_FACING = (
    "runstream.engine.errors",
    "runstream.engine.client.client",
    "runstream.engine.client.placed",
    "runstream.engine.readmodel.model",
    "runstream.engine.kafka.reader",
    "runstream.engine.kafka.restore",
    "runstream.engine.timetravel.fork",
    "runstream.engine.timetravel.dryrun",
)


def test_every_user_facing_error_is_exported() -> None:
    missing = []
    for name in USER_FACING:
        module = importlib.import_module(name)
        for attr, value in vars(module).items():
            if (inspect.isclass(value) and issubclass(value, RunstreamError)
                    and value.__module__ == name and not attr.startswith("_")
                    and attr not in runstream.__all__):
                missing.append(f"{name}.{attr}")
    assert missing == []
    for attr in ("ReadModelLoading", "ReadModelAhead", "RecordsDeleted", "TopicMissing",
                 "ForkRefused"):
        assert getattr(runstream, attr).__name__ == attr and attr in dir(runstream)
