"""`ctx.wait_for_update(name)` and the Update it returns (projections.updates): a request
that wants an answer, taken like a signal and answered with `reply` or `reject`, both
journaled at positions of their own (a replay writes neither again)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from runstream.engine.errors import UpdateAnswered, journal_text
from runstream.engine.flow.definition import dump_json
from runstream.engine.flow.port import JournalPort
from runstream.engine.journal import events as ev
from runstream.engine.journal.input_limits import check_payload
from runstream.projections.state import JournalEntry
from runstream.projections.updates import REPLY_KIND, signal_name


@dataclass(eq=False)
class Update:
    """An update the handler took: its name, its request id and payload; answer it once
    with `reply(value)` (the caller's client.update returns value) or `reject(reason)`
    (the caller gets UpdateRejected)."""

    name: str
    request_id: str
    payload: Any
    _calls: UpdateCalls

    _answered: bool = False  # (a second answer raises UpdateAnswered, journaling nothing)

    async def reply(self, value: Any = None) -> None:
        self._not_answered()
        result_json = check_payload(f"the reply to update {self.name!r}", dump_json(value))
        await self._calls._answer(self, result_json=result_json)
        self._answered = True  # (a reply that raised, too large or not JSON, answered nothing)

    async def reject(self, reason: str) -> None:
        self._not_answered()
        await self._calls._answer(self, rejected=True, reason=journal_text(reason))
        self._answered = True

    def _not_answered(self) -> None:
        """A second answer was journaled, ignored, and sent again at every replay (the
        journal grew by one record a wake); once the first answer left the run's outcome
        index, a replayed second one was applied and became the update's answer."""
        if self._answered:
            raise UpdateAnswered(self.name, self.request_id)


class UpdateCalls:
    """Mixed into FlowContext, which provides positions, waits and the port."""

    _entries: dict[int, JournalEntry]
    _port: JournalPort

    def _next_position(self, name: str, kind: str) -> int:
        raise NotImplementedError

    async def wait_for(self, name: str, *, timeout: float | timedelta | None = None) -> Any:
        raise NotImplementedError

    def _check_cancel(self, position: int, name: str) -> None:
        raise NotImplementedError

    async def wait_for_update(self, name: str, *,
                              timeout: float | timedelta | None = None) -> Update:
        """The next accepted update `name` sent to this run (in the order they arrived),
        waiting durably like `wait_for` (WaitTimeout when `timeout` passes first). Answer it
        with `await update.reply(value)` or `await update.reject(reason)`; one taken and
        not answered when the run ends is refused to its caller."""
        taken = await self.wait_for(signal_name(name), timeout=timeout)
        return Update(name, taken["request_id"], taken["payload"], self)

    async def _answer(self, update: Update, *, result_json: str | None = None,
                      rejected: bool = False, reason: str = "") -> None:
        name = f"reply:{update.name}"
        position = self._next_position(name, REPLY_KIND)
        if position in self._entries:
            return  # (answered before this replay)
        self._check_cancel(position, name)
        self._port.ensure_active()
        self._port.send(ev.UpdateCompleted, request_id=update.request_id, position=position,
                        name=name, result_json=result_json, rejected=rejected, reason=reason)
