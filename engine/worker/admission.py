"""Fair admission: execution slots handed out round-robin across flow names.

A FIFO semaphore would let one flow's backlog (10,000 timers falling due at once) hold
every slot while a run of another flow waits behind it. Here each flow has its own queue
and a freed slot goes to the next flow in turn, so every flow with work gets a share.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque


class Admission:
    """`slots` execution slots; waiters queue per flow. Bound: one queued future per
    execution waiting for a slot (executions are bounded by the owned runs)."""

    def __init__(self, slots: int) -> None:
        self.free = slots
        self._queues: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    @property
    def waiting(self) -> int:
        return sum(len(queue) for queue in self._queues.values())

    async def acquire(self, flow: str) -> None:
        if self.free > 0 and not self._queues:
            self.free -= 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(flow, deque()).append(future)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release()  # granted as we were cancelled: pass the slot on
            else:
                self._forget(flow, future)
            raise

    def release(self) -> None:
        """Give the slot to the next flow in turn (that flow then goes to the back)."""
        while self._queues:
            flow, queue = next(iter(self._queues.items()))
            future = queue.popleft()
            if queue:
                self._queues.move_to_end(flow)
            else:
                del self._queues[flow]
            if not future.done():
                future.set_result(None)
                return
        self.free += 1

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
