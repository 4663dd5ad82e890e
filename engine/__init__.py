"""runstream: a durable execution engine whose only source of truth is a Kafka topic.

The public names below are imported on first use (PEP 562), not when the package is: so
`import engine.journal` (which `projections` needs) does not pull in the client, the
worker and aiokafka, and any module can be imported first without an import cycle.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.client import Client
    from engine.context import ChildRun, FlowContext, idempotency_key
    from engine.dryrun import FlowNotInApp, NoDecision
    from engine.errors import (
        Cancelled,
        CancelRefused,
        CapabilityRefused,
        ChildCancelled,
        ChildFailed,
        CreateRejected,
        FlowCycleDetected,
        IdentityConflict,
        InvalidInput,
        InvalidRunId,
        NonDeterminism,
        PayloadInvalid,
        ResultTimeout,
        ResumeRefused,
        RunCancelled,
        RunFailed,
        RunNotFound,
        RunstreamError,
        SignalRefused,
        SpawnRefused,
        StepFailed,
        WaitTimeout,
    )
    from engine.flow import Flow, HandedOff, Handoff, RetryPolicy
    from engine.fork import ForkNeedsForce, ForkTargetExists, ForkTooLarge
    from engine.handle import RunHandle
    from engine.worker import Worker
    from projections.state import RunStatus

_EXPORTS = {
    "Client": "engine.client",
    "ChildRun": "engine.context",
    "FlowContext": "engine.context",
    "idempotency_key": "engine.context",
    "CancelRefused": "engine.errors",
    "Cancelled": "engine.errors",
    "CapabilityRefused": "engine.errors",
    "ChildCancelled": "engine.errors",
    "ChildFailed": "engine.errors",
    "CreateRejected": "engine.errors",
    "FlowCycleDetected": "engine.errors",
    "IdentityConflict": "engine.errors",
    "InvalidRunId": "engine.errors",
    "NonDeterminism": "engine.errors",
    "PayloadInvalid": "engine.errors",
    "ResultTimeout": "engine.errors",
    "ResumeRefused": "engine.errors",
    "RunCancelled": "engine.errors",
    "RunFailed": "engine.errors",
    "RunNotFound": "engine.errors",
    "RunstreamError": "engine.errors",
    "SignalRefused": "engine.errors",
    "SpawnRefused": "engine.errors",
    "StepFailed": "engine.errors",
    "WaitTimeout": "engine.errors",
    "InvalidInput": "engine.errors",
    "FlowNotInApp": "engine.dryrun",
    "NoDecision": "engine.dryrun",
    "ForkNeedsForce": "engine.fork",
    "ForkTargetExists": "engine.fork",
    "ForkTooLarge": "engine.fork",
    "Flow": "engine.flow",
    "HandedOff": "engine.flow",
    "Handoff": "engine.flow",
    "RetryPolicy": "engine.flow",
    "RunHandle": "engine.handle",
    "Worker": "engine.worker",
    "RunStatus": "projections.state",
}

__all__ = [
    "CancelRefused",
    "Cancelled",
    "CapabilityRefused",
    "ChildCancelled",
    "ChildFailed",
    "ChildRun",
    "Client",
    "CreateRejected",
    "Flow",
    "FlowContext",
    "FlowCycleDetected",
    "FlowNotInApp",
    "ForkNeedsForce",
    "ForkTargetExists",
    "ForkTooLarge",
    "HandedOff",
    "Handoff",
    "IdentityConflict",
    "InvalidInput",
    "InvalidRunId",
    "NoDecision",
    "NonDeterminism",
    "PayloadInvalid",
    "ResultTimeout",
    "ResumeRefused",
    "RetryPolicy",
    "RunCancelled",
    "RunFailed",
    "RunHandle",
    "RunNotFound",
    "RunStatus",
    "RunstreamError",
    "SignalRefused",
    "SpawnRefused",
    "StepFailed",
    "WaitTimeout",
    "Worker",
    "idempotency_key",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
