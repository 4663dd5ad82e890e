"""Irreversible step calls a release kept running (engine.flow.carried), each until the run
is executed here again and its handler takes the call, or the partition goes elsewhere.

A release (Kafka's eager rebalance revokes every partition of every member) lets a
partition's runs finish for `--drain-timeout`, then cancels their handlers. An irreversible
step's call still running is not cancelled with its handler: it is kept here, by (run id,
position, attempt). When the group gives the partition back to this worker, the run's next
activation replays to that step and awaits the call, so its outcome is journaled instead of
the run quarantined. When the partition goes to another member, the call is cut (cancelled)
as the drain used to, and that member quarantines the run: its effect may have happened. A
call whose run settles meanwhile, or that is not taken within KEPT_S, is cut too.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("runstream.carried")

# Calls kept at once. Each is the call of an execution a release cut (at most the worker's
# concurrency per release); past the bound the oldest is cut.
MAX_CARRIED = 1_024
# A call kept this long and not taken is cut (still running) or dropped (ended): its run was
# not executed here again (the claim never came, or the run settled without its handler
# some other way than `settled` hears of).
KEPT_S = 600.0
MAX_LOGGED = 10

Key = tuple[str, int, int]  # (run incarnation id, position, attempt)


@dataclass(frozen=True)
class Kept:
    partition: int
    call: asyncio.Future[Any]
    lapse: asyncio.TimerHandle  # cuts it KEPT_S after it was kept


class CarriedCalls:
    """The calls kept, each by its run's incarnation id (a run id used again after retention
    is another run), position and attempt; and the calls cut whose function has not returned
    yet (referenced until it does: the event loop holds a task weakly)."""

    def __init__(self, *, kept_s: float = KEPT_S) -> None:
        self._kept: OrderedDict[Key, Kept] = OrderedDict()
        self._cut: set[asyncio.Future[Any]] = set()
        self._kept_s = kept_s

    def __len__(self) -> int:
        return len(self._kept)

    def hold(self, partition: int, incarnation: str, position: int, attempt: int,
             call: asyncio.Future[Any]) -> None:
        key = (incarnation, position, attempt)
        self._drop(key)
        lapse = asyncio.get_running_loop().call_later(self._kept_s, self._lapsed, key, call)
        self._kept[key] = Kept(partition, call, lapse)
        while len(self._kept) > MAX_CARRIED:
            old = next(iter(self._kept))
            self._drop(old)
            log.warning("run %s: an irreversible step's call kept through a release was cut: "
                        "more than %d calls kept", old[0], MAX_CARRIED)

    def holds(self, incarnation: str, position: int, attempt: int) -> bool:
        return (incarnation, position, attempt) in self._kept

    def take(self, incarnation: str, position: int, attempt: int) -> asyncio.Future[Any] | None:
        kept = self._kept.pop((incarnation, position, attempt), None)
        if kept is None:
            return None
        kept.lapse.cancel()
        return kept.call

    def settled(self, incarnation: str) -> None:
        """The run settled (its deadline failed it without a handler, say): nothing takes its
        calls any more."""
        for key in [key for key in self._kept if key[0] == incarnation]:
            self._drop(key)
            log.warning("run %s settled: the irreversible call kept through a release (step "
                        "%d, attempt %d) is cut", *key)

    def keep_only(self, partitions: Iterable[int], *, why: str) -> list[str]:
        """Cut the calls of every partition not in `partitions` (the group gave them to
        another member; or none: the worker stops). Returns their runs' incarnation ids."""
        staying = set(partitions)
        gone = [key for key, kept in self._kept.items() if kept.partition not in staying]
        for key in gone:
            self._drop(key)
        runs = [incarnation for incarnation, _, _ in gone]
        if runs:
            log.warning("%d irreversible step call(s) kept through a release were cut (%s); "
                        "their runs' next owner quarantines them: %s", len(runs), why,
                        ", ".join(runs[:MAX_LOGGED]))
        return runs

    def _lapsed(self, key: Key, call: asyncio.Future[Any]) -> None:
        kept = self._kept.get(key)
        if kept is not None and kept.call is call:
            self._drop(key)
            log.warning("run %s: the irreversible call kept through a release (step %d, "
                        "attempt %d) was not taken within %.0f s: cut", *key, self._kept_s)

    def _drop(self, key: Key) -> None:
        kept = self._kept.pop(key, None)
        if kept is None:
            return
        kept.lapse.cancel()
        if kept.call.done():
            _retrieved(kept.call)
            return
        kept.call.cancel()
        self._cut.add(kept.call)
        kept.call.add_done_callback(self._ended)

    def _ended(self, call: asyncio.Future[Any]) -> None:
        self._cut.discard(call)
        _retrieved(call)


def _retrieved(call: asyncio.Future[Any]) -> None:
    """Its outcome is nobody's now: retrieved, so asyncio does not report it unretrieved."""
    if not call.cancelled() and call.exception() is not None:
        log.debug("a cut irreversible call ended in %r", call.exception())
