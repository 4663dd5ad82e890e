"""Errors a runstream user can meet, each saying what happened and what to do."""

from __future__ import annotations


class RunstreamError(Exception):
    """Base class of every runstream error."""


class RunFailed(RunstreamError):
    """The run ended in failure; error_type and message come from the journal."""

    def __init__(self, run_id: str, error_type: str, message: str) -> None:
        super().__init__(f"run {run_id} failed: {error_type}: {message}")
        self.run_id = run_id
        self.error_type = error_type
        self.message = message


class RunCancelled(RunstreamError):
    def __init__(self, run_id: str, reason: str) -> None:
        super().__init__(f"run {run_id} was cancelled: {reason}")
        self.run_id = run_id
        self.reason = reason


class IdentityConflict(RunstreamError):
    """A create request reused a run id with a different flow or payload."""

    def __init__(self, run_id: str, field: str, existing: str, requested: str) -> None:
        super().__init__(
            f"run id {run_id!r} already belongs to a run with {field}={existing}, "
            f"not {field}={requested}: use another run id or the same {field}"
        )
        self.run_id = run_id
        self.field = field
        self.existing = existing
        self.requested = requested


class CreateRejected(RunstreamError):
    """The owner refused a create request for a reason other than identity."""

    def __init__(self, run_id: str, reason: str, detail: str) -> None:
        super().__init__(f"run {run_id} was not created: {reason}: {detail}")
        self.run_id = run_id
        self.reason = reason
        self.detail = detail


class PayloadInvalid(RunstreamError):
    def __init__(self, flow: str, detail: str) -> None:
        super().__init__(f"payload does not fit flow {flow!r}: {detail}")
        self.flow = flow
        self.detail = detail


class RunNotFound(RunstreamError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run {run_id!r} in this namespace: check the id and --namespace")
        self.run_id = run_id


class ResultTimeout(RunstreamError, TimeoutError):
    def __init__(self, run_id: str, timeout: float, status: str) -> None:
        super().__init__(f"run {run_id} did not settle within {timeout:g}s (last seen: {status})")
        self.run_id = run_id


class NonDeterminism(RunstreamError):
    """A re-activation asked for a different step than the journal holds at that position."""


class StepFailed(RunstreamError):
    """A step used up its attempts; raised inside the flow at the step's call."""

    def __init__(self, step: str, error_type: str, message: str, attempts: int) -> None:
        super().__init__(
            f"step {step!r} failed after {attempts} attempt(s): {error_type}: {message}"
        )
        self.step = step
        self.error_type = error_type
        self.message = message
        self.attempts = attempts


class WorkerFatal(RunstreamError):
    """The worker cannot go on safely (its producer failed); restart it."""


def journal_text(text: str, limit: int = 4000) -> str:
    """Text safe to journal: valid UTF-8 (lone surrogates escaped) and bounded in size.

    Error messages and tracebacks come from anywhere (file names decoded with
    surrogateescape, huge reprs); one that cannot be encoded must not stop a run settling.
    """
    safe = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return safe if len(safe) <= limit else safe[: limit - 20] + f"... ({len(safe)} chars)"
