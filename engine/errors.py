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
    """No such run. `rejected`: why the journal's create of that id was rejected, when it
    holds one (a plain producer's create: no client was there to raise CreateRejected);
    `records`: the command that shows its records (default: the run's history)."""

    def __init__(self, run_id: str, *, rejected: str | None = None,
                 records: str | None = None) -> None:
        if rejected is None:
            text = f"no run {run_id!r} in this namespace: check the id and --namespace"
        else:
            text = (f"no run {run_id!r}: its create was rejected ({rejected}); its records: "
                    f"{records or f'runstream run history {run_id}'}")
        super().__init__(text)
        self.run_id = run_id
        self.rejected = rejected


class RunExpired(RunNotFound):
    """The run settled and expired: the projections keep only its tombstone (when it
    settled, how, when it expired); its records stay on the journal. `detail` says when
    and after what (projections.expiry.expired_text)."""

    def __init__(self, run_id: str, detail: str) -> None:
        RunstreamError.__init__(
            self, f"run {run_id!r} {detail}; its records: runstream run history {run_id}")
        self.run_id = run_id
        self.detail = detail


class ResultTimeout(RunstreamError, TimeoutError):
    """An answer a client waited for did not come in time: a run's settlement, by default
    (`waited_for`: what else did not happen; `subject`: what it is about, if not the run;
    `note`: what the caller should know, e.g. that the request stands)."""

    def __init__(self, run_id: str, timeout: float, status: str = "", *,
                 waited_for: str = "did not settle", subject: str | None = None,
                 note: str = "") -> None:
        seen = f" (last seen: {status})" if status else ""
        more = f"; {note}" if note else ""
        super().__init__(
            f"{subject or f'run {run_id}'} {waited_for} within {timeout:g}s{seen}{more}")
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


class NonRetryable(RunstreamError):
    """Raise it from a step (or raise another exception from it: `raise X from
    NonRetryable(...)`) to fail the step without another attempt, whatever its RetryPolicy
    says (Temporal's non-retryable application error). `NonRetryable(exc)` wraps an
    exception: the step's error says what it was."""

    def __init__(self, message: object = "") -> None:
        text = (f"{type(message).__name__}: {message}" if isinstance(message, BaseException)
                else str(message))
        super().__init__(text)
        self.wrapped = message if isinstance(message, BaseException) else None


class RunTimedOut(RunFailed):
    """The run passed its deadline (`Flow(timeout=)`, `create_run(run_timeout=)`) and was
    failed: its handler was interrupted, or, past its cleanup grace, abandoned."""


def run_failure(run_id: str, error_type: str, message: str) -> RunFailed:
    """The error a failed run's result raises: RunTimedOut for a timeout, else RunFailed."""
    cls = RunTimedOut if error_type == "RunTimedOut" else RunFailed
    return cls(run_id, error_type, message)


class ScheduleNotFound(RunstreamError):
    """No schedule with this id (never created, or deleted)."""

    def __init__(self, schedule_id: str) -> None:
        super().__init__(f"no schedule {schedule_id!r}")
        self.schedule_id = schedule_id


class ScheduleRejected(RunstreamError):
    """The schedule's owner refused a change (a bad cron expression or time zone, a create
    of an existing schedule, a change of a missing one): its reason."""

    def __init__(self, schedule_id: str, action: str, reason: str) -> None:
        super().__init__(f"schedule {schedule_id!r}: {action} refused: {reason}")
        self.schedule_id = schedule_id
        self.action = action
        self.reason = reason


class StepTimedOut(RunstreamError, TimeoutError):
    """An attempt of a step ran past its `timeout` (`ctx.step(..., timeout=)`): a failed
    attempt, retried under the step's RetryPolicy like any other error. An irreversible step
    that times out is quarantined (its effect may have happened)."""

    def __init__(self, step: str, attempt: int, seconds: float) -> None:
        super().__init__(f"step {step!r} attempt {attempt} timed out after {seconds:g} s")
        self.step = step
        self.attempt = attempt
        self.seconds = seconds


class ThreadsExhausted(RunstreamError):
    """A step with a `timeout` or an update's validator needed a thread of its own while
    MAX_OWN_THREADS such threads were alive (engine.flow.bounded), most of them calls
    abandoned when their limit passed that never returned: the call was not started. A
    step's attempt fails with it, and is retried under its RetryPolicy; a validator's
    update is rejected."""

    def __init__(self, name: str, alive: int) -> None:
        super().__init__(f"{name}: not started, {alive} calls abandoned or running in "
                         f"threads of their own are still alive (the most kept); a function "
                         f"that never returns holds its thread")
        self.name = name
        self.alive = alive


class WorkerFatal(RunstreamError):
    """The worker cannot go on safely (its producer failed); restart it."""


class StoreInUse(RunstreamError):
    """A RocksDB store (a worker's data dir, a read model's) another process, or another
    object of this one, holds open: RocksDB's lock allows one writer."""


def journal_text(text: str, limit: int = 4000) -> str:
    """Text safe to journal: valid UTF-8 (lone surrogates escaped) and bounded in size.

    Error messages and tracebacks come from anywhere (file names decoded with
    surrogateescape, huge reprs); one that cannot be encoded must not stop a run settling.
    """
    safe = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return safe if len(safe) <= limit else safe[: limit - 20] + f"... ({len(safe)} chars)"


class WaitTimeout(RunstreamError, TimeoutError):
    """Raised inside a flow by `ctx.wait_for` when no signal came before its timeout, or an
    operator ended the wait early (`client.resume`)."""

    def __init__(self, name: str, message: str = "") -> None:
        super().__init__(message or f"no {name!r} signal before the timeout")
        self.name = name


class ChildFailed(RunstreamError):
    """Raised inside a parent flow by `child.result()` when the child run failed."""

    def __init__(self, child_run_id: str, error_type: str, message: str) -> None:
        super().__init__(f"child run {child_run_id} failed: {error_type}: {message}")
        self.child_run_id = child_run_id
        self.error_type = error_type
        self.message = message


class ChildCancelled(RunstreamError):
    """Raised inside a parent flow by `child.result()` when the child run was cancelled."""

    def __init__(self, child_run_id: str, reason: str) -> None:
        super().__init__(f"child run {child_run_id} was cancelled: {reason}")
        self.child_run_id = child_run_id
        self.reason = reason


class FlowCycleDetected(RunstreamError):
    """A spawn named a run that is an ancestor of the spawner (or the spawner itself)."""

    def __init__(self, path: list[str]) -> None:
        super().__init__("spawning would make a cycle of runs: " + " -> ".join(path))
        self.path = path


class SpawnRefused(RunstreamError):
    """A spawn the engine cannot honour (too many open children, a tree too deep)."""


class Cancelled(BaseException):
    """Raised inside a flow at its first durable call after a cancel request reached the run.

    A BaseException, like asyncio.CancelledError, so `except Exception` does not swallow it;
    `finally` blocks run, and durable calls made in them are journaled as cleanup. Letting
    it propagate ends the run cancelled.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(f"the run was cancelled: {reason}")
        self.reason = reason


class SignalRefused(RunstreamError):
    """The run did not take the signal: it ended, or its buffer of undelivered signals is
    full. Nothing was delivered."""

    def __init__(self, run_id: str, name: str, why: str) -> None:
        super().__init__(f"signal {name!r} to run {run_id} was refused: {why}")
        self.run_id = run_id
        self.name = name
        self.why = why


class CancelRefused(RunstreamError):
    """A cancel request the client refuses to send, or the run refused (it has ended)."""


class ResumeRefused(RunstreamError):
    """An operator resume the run cannot take (not waiting, waiting for a child, quarantined)."""

    def __init__(self, run_id: str, why: str) -> None:
        super().__init__(f"run {run_id} cannot be resumed: {why}")
        self.run_id = run_id
        self.why = why


class CapabilityRefused(RunstreamError):
    """A step required a capability outside its run's ceiling, or a client's authority does
    not cover a run's ceiling. Names what is missing."""

    def __init__(self, message: str, *, capability: str = "", step: str = "",
                 missing: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.capability = capability
        self.step = step
        self.missing = missing


class InvalidRunId(RunstreamError, ValueError):
    """A run id the engine cannot use as given."""


class InvalidInput(RunstreamError):
    """An argument the command or call cannot take (a malformed time, point, option)."""


class ClientClosed(RunstreamError):
    """The Client was closed (its `async with` ended, or close() was called). A closed
    client does not open its connections again: its handles and queries need it open."""

    def __init__(self) -> None:
        super().__init__("the Client is closed: use it and the RunHandles it gave inside "
                         "`async with Client(...)`, or open a new Client")


class ReadModelClosed(RunstreamError):
    """The read model was closed while this call caught it up or read it: a fold under way
    stops at its next record (every record before it applied whole), and the store closes
    once nothing reads it. A Client's calls raise ClientClosed instead."""

    def __init__(self) -> None:
        super().__init__("the read model was closed while this call read it")


class SettingInvalid(InvalidInput, ValueError):
    """A RUNSTREAM_* variable the engine cannot take (engine.journal.settings.env_count,
    engine.config.env_duration): its message names the variable and the value."""


class BrokerConnectionFailed(RunstreamError):
    """No connection to the brokers can succeed as configured: nothing listens, the
    credentials are wrong, or the security protocol does not match the listener."""


class AccessDenied(RunstreamError):
    """The broker's ACLs do not allow this principal what it tried (write a topic, read a
    group, ...)."""


class InvalidAttributes(RunstreamError, ValueError):
    """Run attributes the engine cannot take: a bad name, a value of an unsupported type,
    more than 64 of them or more than 2 KiB in all (projections.attributes)."""


class QueryInvalid(RunstreamError, ValueError):
    """A run query that does not parse or cannot be answered; `position` is the character
    (0-based) where the problem starts."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(f"{message} (at position {position})")
        self.position = position


class UpdateRejected(RunstreamError):
    """An update was rejected: by its flow's validator (or its time limit) before the run
    took it, or by the handler (`update.reject(reason)`); `reason` says why."""

    def __init__(self, run_id: str, name: str, reason: str) -> None:
        super().__init__(f"update {name!r} of run {run_id} was rejected: {reason}")
        self.run_id, self.name, self.reason = run_id, name, reason


class UpdateAnswered(RunstreamError):
    """A handler answered an update it had answered already (`reply` or `reject` a second
    time): an update has one answer, its first."""

    def __init__(self, name: str, request_id: str) -> None:
        super().__init__(f"update {name!r} ({request_id}) was answered already: reply to or "
                         f"reject an update once")
        self.name, self.request_id = name, request_id


class UpdateRefused(RunstreamError):
    """An update the run cannot answer: it has ended (before or after taking it, without
    answering it), or it holds as many updates and signals as it keeps."""

    def __init__(self, run_id: str, name: str, why: str) -> None:
        super().__init__(f"update {name!r} of run {run_id} was refused: {why}")
        self.run_id, self.name, self.why = run_id, name, why
