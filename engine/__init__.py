"""runstream: a durable execution engine whose only source of truth is a Kafka topic."""

from engine.client import Client, RunHandle
from engine.context import FlowContext
from engine.errors import (
    CreateRejected,
    IdentityConflict,
    NonDeterminism,
    PayloadInvalid,
    ResultTimeout,
    RunCancelled,
    RunFailed,
    RunNotFound,
    RunstreamError,
    StepFailed,
)
from engine.flow import Flow, RetryPolicy
from engine.worker import Worker
from projections.state import RunStatus

__all__ = [
    "Client",
    "CreateRejected",
    "Flow",
    "FlowContext",
    "IdentityConflict",
    "NonDeterminism",
    "PayloadInvalid",
    "ResultTimeout",
    "RetryPolicy",
    "RunCancelled",
    "RunFailed",
    "RunHandle",
    "RunNotFound",
    "RunStatus",
    "RunstreamError",
    "StepFailed",
    "Worker",
]
