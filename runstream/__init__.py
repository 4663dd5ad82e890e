"""runstream: a durable execution engine whose only source of truth is a Kafka topic.

    from runstream import Client, Flow, FlowContext, Worker
    from runstream.testing import TestEnvironment

`import runstream` works too: `runstream.idempotency_key()` inside a step,
`except runstream.Cancelled:` in a handler's cleanup.

This module is the package users import: it re-exports what they use (the client, flows,
the worker, the errors they catch). The names are imported on first use (PEP 562), not when
the package is, so `import runstream.testing` or `import runstream.engine.journal` does not
pull in the client, the worker and aiokafka.

The code lives in two packages: `runstream.projections` (everything pure, plus its storage)
and `runstream.engine` (I/O and the faces users touch); see docs/architecture.md. This
facade may import any of them; no library package imports it (the demo's flows do, written
as users write theirs), and nothing imports the deprecated top-level names `engine` and
`projections` (runstream._legacy).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runstream.engine.client.client import Client
    from runstream.engine.client.handle import RunHandle
    from runstream.engine.client.placed import RequestNotRelayed
    from runstream.engine.config import DurationInvalid
    from runstream.engine.errors import (
        AccessDenied,
        BrokerConnectionFailed,
        Cancelled,
        CancelRefused,
        CapabilityRefused,
        ChildCancelled,
        ChildFailed,
        ClientClosed,
        CreateRejected,
        FlowCycleDetected,
        IdentityConflict,
        InvalidAttributes,
        InvalidInput,
        InvalidRunId,
        NonDeterminism,
        NonRetryable,
        PayloadInvalid,
        QueryInvalid,
        ReadModelClosed,
        ResultTimeout,
        ResumeRefused,
        RunCancelled,
        RunExpired,
        RunFailed,
        RunNotFound,
        RunstreamError,
        RunTimedOut,
        ScheduleNotFound,
        ScheduleRejected,
        SettingInvalid,
        SignalRefused,
        SpawnRefused,
        StepFailed,
        StepTimedOut,
        StoreInUse,
        ThreadsExhausted,
        UpdateAnswered,
        UpdateRefused,
        UpdateRejected,
        WaitTimeout,
        WorkerFatal,
    )
    from runstream.engine.flow.context import ChildRun, FlowContext, Update, idempotency_key
    from runstream.engine.flow.definition import (
        Flow,
        HandedOff,
        Handoff,
        PayloadNotJson,
        ResultNotJson,
        RetryPolicy,
    )
    from runstream.engine.kafka.reader import TopicMissing
    from runstream.engine.kafka.requests_topic import RelayMisconfigured
    from runstream.engine.kafka.restore import RecordsDeleted
    from runstream.engine.readmodel.model import ReadModelAhead, ReadModelLoading
    from runstream.engine.timetravel.dryrun import FlowNotInApp, NoDecision
    from runstream.engine.timetravel.fork import ForkNotAnswered, ForkRefused
    from runstream.engine.worker import Worker
    from runstream.projections.batch import BatchInvalid
    from runstream.projections.fork_plan import ForkNeedsForce, ForkTargetExists, ForkTooLarge
    from runstream.projections.state import RunStatus

_EXPORTS = {
    "Client": "runstream.engine.client.client",
    "RequestNotRelayed": "runstream.engine.client.placed",
    "RelayMisconfigured": "runstream.engine.kafka.requests_topic",
    "TopicMissing": "runstream.engine.kafka.reader",
    "RecordsDeleted": "runstream.engine.kafka.restore",
    "ReadModelAhead": "runstream.engine.readmodel.model",
    "ReadModelLoading": "runstream.engine.readmodel.model",
    "ForkRefused": "runstream.engine.timetravel.fork",
    "ForkNotAnswered": "runstream.engine.timetravel.fork",
    "ChildRun": "runstream.engine.flow.context",
    "FlowContext": "runstream.engine.flow.context",
    "idempotency_key": "runstream.engine.flow.context",
    "CancelRefused": "runstream.engine.errors",
    "Cancelled": "runstream.engine.errors",
    "CapabilityRefused": "runstream.engine.errors",
    "ChildCancelled": "runstream.engine.errors",
    "ChildFailed": "runstream.engine.errors",
    "CreateRejected": "runstream.engine.errors",
    "FlowCycleDetected": "runstream.engine.errors",
    "IdentityConflict": "runstream.engine.errors",
    "InvalidRunId": "runstream.engine.errors",
    "InvalidAttributes": "runstream.engine.errors",
    "BatchInvalid": "runstream.projections.batch",
    "QueryInvalid": "runstream.engine.errors",
    "UpdateAnswered": "runstream.engine.errors",
    "UpdateRefused": "runstream.engine.errors",
    "UpdateRejected": "runstream.engine.errors",
    "Update": "runstream.engine.flow.context",
    "NonDeterminism": "runstream.engine.errors",
    "PayloadInvalid": "runstream.engine.errors",
    "ResultTimeout": "runstream.engine.errors",
    "ClientClosed": "runstream.engine.errors",
    "ReadModelClosed": "runstream.engine.errors",
    "SettingInvalid": "runstream.engine.errors",
    "AccessDenied": "runstream.engine.errors",
    "BrokerConnectionFailed": "runstream.engine.errors",
    "WorkerFatal": "runstream.engine.errors",
    "StoreInUse": "runstream.engine.errors",
    "ResumeRefused": "runstream.engine.errors",
    "RunCancelled": "runstream.engine.errors",
    "RunExpired": "runstream.engine.errors",
    "RunFailed": "runstream.engine.errors",
    "RunNotFound": "runstream.engine.errors",
    "RunTimedOut": "runstream.engine.errors",
    "ScheduleNotFound": "runstream.engine.errors",
    "ScheduleRejected": "runstream.engine.errors",
    "RunstreamError": "runstream.engine.errors",
    "SignalRefused": "runstream.engine.errors",
    "SpawnRefused": "runstream.engine.errors",
    "StepFailed": "runstream.engine.errors",
    "StepTimedOut": "runstream.engine.errors",
    "ThreadsExhausted": "runstream.engine.errors",
    "NonRetryable": "runstream.engine.errors",
    "WaitTimeout": "runstream.engine.errors",
    "InvalidInput": "runstream.engine.errors",
    "FlowNotInApp": "runstream.engine.timetravel.dryrun",
    "NoDecision": "runstream.engine.timetravel.dryrun",
    "ForkNeedsForce": "runstream.projections.fork_plan",
    "ForkTargetExists": "runstream.projections.fork_plan",
    "ForkTooLarge": "runstream.projections.fork_plan",
    "Flow": "runstream.engine.flow.definition",
    "HandedOff": "runstream.engine.flow.definition",
    "Handoff": "runstream.engine.flow.definition",
    "RetryPolicy": "runstream.engine.flow.definition",
    "PayloadNotJson": "runstream.engine.flow.definition",
    "ResultNotJson": "runstream.engine.flow.definition",
    "DurationInvalid": "runstream.engine.config",
    "RunHandle": "runstream.engine.client.handle",
    "Worker": "runstream.engine.worker",
    "RunStatus": "runstream.projections.state",
}

__all__ = [
    "AccessDenied",
    "BatchInvalid",
    "BrokerConnectionFailed",
    "CancelRefused",
    "Cancelled",
    "CapabilityRefused",
    "ChildCancelled",
    "ChildFailed",
    "ChildRun",
    "Client",
    "ClientClosed",
    "CreateRejected",
    "DurationInvalid",
    "Flow",
    "FlowContext",
    "FlowCycleDetected",
    "FlowNotInApp",
    "ForkNeedsForce",
    "ForkNotAnswered",
    "ForkRefused",
    "ForkTargetExists",
    "ForkTooLarge",
    "HandedOff",
    "Handoff",
    "IdentityConflict",
    "InvalidAttributes",
    "InvalidInput",
    "InvalidRunId",
    "NoDecision",
    "NonDeterminism",
    "NonRetryable",
    "PayloadInvalid",
    "PayloadNotJson",
    "QueryInvalid",
    "ReadModelAhead",
    "ReadModelClosed",
    "ReadModelLoading",
    "RecordsDeleted",
    "RelayMisconfigured",
    "RequestNotRelayed",
    "ResultNotJson",
    "ResultTimeout",
    "ResumeRefused",
    "RetryPolicy",
    "RunCancelled",
    "RunExpired",
    "RunFailed",
    "RunHandle",
    "RunNotFound",
    "RunStatus",
    "RunTimedOut",
    "RunstreamError",
    "ScheduleNotFound",
    "ScheduleRejected",
    "SettingInvalid",
    "SignalRefused",
    "SpawnRefused",
    "StepFailed",
    "StepTimedOut",
    "StoreInUse",
    "ThreadsExhausted",
    "TopicMissing",
    "Update",
    "UpdateAnswered",
    "UpdateRefused",
    "UpdateRejected",
    "WaitTimeout",
    "Worker",
    "WorkerFatal",
    "idempotency_key",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'runstream' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
