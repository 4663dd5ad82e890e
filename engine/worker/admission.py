"""Fair admission: execution slots handed out round-robin across flow names, within each
flow's own limit.

A FIFO semaphore would let one flow's backlog (10,000 timers falling due at once) hold
every slot while a run of another flow waits behind it. Here each flow has its own queue
and a freed slot goes to the next flow in turn, so every flow with work gets a share.

A flow may also bound how many of its runs execute at once here (`Flow(max_concurrency=N)`):
a flow at its limit is passed over in the turn (its runs wait, in the order they asked,
which is their partition's create order), and the slot goes to the next flow that may use
it. A suspended run holds no slot, so it counts against no limit.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Any

from runstream.engine.errors import InvalidInput
from runstream.engine.flow.definition import Flow

DEFAULT_CONCURRENCY = 64  # a worker's execution slots (and a TestEnvironment's)


class Admission:
    """`slots` execution slots; waiters queue per flow. Bounds: one queued future per
    execution waiting for a slot (executions are bounded by the owned runs); one count and
    one limit per flow name registered or seen here."""

    def __init__(self, slots: int, limits: dict[str, int] | None = None) -> None:
        # No slot at all would let no run execute, ever: refused when the worker is built.
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise InvalidInput(f"concurrency must be a whole number of execution slots, 1 "
                               f"or more, not {slots!r}")
        self.slots = slots  # (all of them)
        self.free = slots
        self._queues: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        self._limits = dict(limits or {})  # flow -> max_concurrency (absent: none)
        self._held: dict[str, int] = {}  # flow -> slots its runs hold now

    @classmethod
    def for_flows(cls, slots: int, flows: Iterable[Flow[Any, Any]]) -> Admission:
        """`slots` slots, each flow held to its own max_concurrency."""
        return cls(slots, {f.name: f.max_concurrency for f in flows
                           if f.max_concurrency is not None})

    @property
    def waiting(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    def held(self, flow: str) -> int:
        return self._held.get(flow, 0)

    def at_limit(self, flow: str) -> bool:
        """Whether the flow's runs hold as many slots as its max_concurrency allows."""
        limit = self._limits.get(flow)
        return limit is not None and self._held.get(flow, 0) >= limit

    async def acquire(self, flow: str) -> None:
        # A free slot means no waiter that may use it is left (release hands each freed
        # slot to one): take it, unless this flow is at its limit.
        if self.free > 0 and not self.at_limit(flow):
            self._grant(flow)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(flow, deque()).append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(flow)  # granted as we were cancelled: pass the slot on
            else:
                self._forget(flow, future)
            raise

    def release(self, flow: str) -> None:
        """A run of `flow` gives its slot back: it goes to the next flow in turn that may
        use it (that flow then goes to the back)."""
        held = self._held.get(flow, 0) - 1
        if held > 0:
            self._held[flow] = held
        else:
            self._held.pop(flow, None)
        self.free += 1
        self._hand_out()

    def _grant(self, flow: str) -> None:
        self.free -= 1
        self._held[flow] = self._held.get(flow, 0) + 1

    def _hand_out(self) -> None:
        while self.free > 0:
            flow = next((f for f in self._queues if not self.at_limit(f)), None)
            if flow is None:
                return  # every waiting flow is at its limit: the slot stays free
            queue = self._queues[flow]
            future = queue.popleft()
            if queue:
                self._queues.move_to_end(flow)
            else:
                del self._queues[flow]
            if not future.done():
                self._grant(flow)
                future.set_result(None)

    def _forget(self, flow: str, future: asyncio.Future[None]) -> None:
        queue = self._queues.get(flow)
        if queue is None:
            return
        try:
            queue.remove(future)
        except ValueError:
            return
        if not queue:
            del self._queues[flow]
