"""Why the requests relay refused a client's request: its copy in the namespace's dead letters.

The relay (engine.worker.relay) forwards a request of `<ns>.requests[.<authority>]` to the
journal, or refuses it and copies it to `<ns>.dead-letter` with two headers of its own: why
(REASON_HEADER, a sentence) and whence (SOURCE_HEADER, "<topic>:<partition>:<offset>").
A client that waits for its request to reach the journal reads that copy to say why it
never will, at once, where it waited for its relay timeout (a minute by default) and then
asked whether a worker was up. A copy is the request's when its source is exactly where
the request went (a refusal of an earlier send under the same request id is not this
one's: the relay may forward this one).

The thin aiokafka driver: one consumer without a group per client (`RefusalWatch`), on the
dead-letter topic from a little before the first request it looks for was made (by the
writers' clocks: a copy's timestamp is the relay's, the request's the client's), running
while some request waits. A principal that may not read the dead letters (the client role
may not: they hold every authority's refused requests) is remembered, and not asked again.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from runstream.engine.config import dead_letter_topic
from runstream.engine.errors import AccessDenied, RunstreamError
from runstream.engine.kafka.closing import stop_soon
from runstream.engine.kafka.connection import KafkaSecurity, denied_by_acls, start_client
from runstream.engine.kafka.reader import partition_count, reader_consumer
from runstream.engine.kafka.unreadable import getmany_readable

log = logging.getLogger(__name__)

REASON_HEADER = "runstream-dead-letter-reason"
SOURCE_HEADER = "runstream-dead-letter-source"  # <topic>:<partition>:<offset>

# How far before the request's own time its copy is looked for: the relay's clock and the
# client's may differ by this much (and dead letters are rare: the few read are cheap).
CLOCK_SKEW_MS = 5 * 60 * 1000
POLL_MS = 500
READ_KEPT = 1_000  # refusals read kept for a wait that starts after its copy was read


class RefusalWatch:
    """The relay's refusals of one client's requests (see the module docstring)."""

    def __init__(self, bootstrap: str, namespace: str, security: KafkaSecurity | None) -> None:
        self.bootstrap = bootstrap
        self.topic = dead_letter_topic(namespace)
        self.security = security
        self.denied = False  # this principal may not read the dead letters: never looked again
        # source -> its waiters (two handles may wait on one request). Bound: the client's
        # waits on relayed requests, each removed when it ends.
        self._waiting: dict[str, list[asyncio.Future[str | None]]] = {}
        # source -> reason, of copies read while no wait named them yet (or no longer):
        # a wait that starts after its copy was read (a second wait on one request while
        # another request keeps the look alive) is told at once. Bound: READ_KEPT.
        self._read: dict[str, str] = {}
        self._live: object | None = None  # the running look's token (None: none runs)
        self._tasks: set[asyncio.Task[None]] = set()

    async def refusal(self, source: str, made_ms: int) -> str | None:
        """The relay's reason for refusing the request it read at `source`, once its copy is
        in the dead letters (waits: the caller cancels); None when they cannot be read."""
        if self.denied:
            return None
        if source in self._read:
            return self._read[source]
        waiter: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(source, []).append(waiter)
        if self._live is None:
            token = self._live = object()
            task = asyncio.create_task(self._look(token, made_ms - CLOCK_SKEW_MS),
                                       name="runstream-relay-refusals")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        try:
            return await waiter
        finally:
            waiters = self._waiting.get(source, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self._waiting.pop(source, None)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _look(self, token: object, since_ms: int) -> None:
        consumer = reader_consumer(self.bootstrap, security=self.security,
                                   client_id="runstream-refusals")
        try:
            tps = await self._from(consumer, since_ms)
            while self._waiting and self._live is token:
                batches = await getmany_readable(consumer, *tps, timeout_ms=POLL_MS)
                for records in batches.values():
                    for record in records:
                        self._answer(dict(record.headers or ()))
        except (RunstreamError, KafkaError) as exc:  # (AccessDenied, TopicMissing, ...)
            self.denied = isinstance(exc, AccessDenied) or denied_by_acls(exc) is not None
            log.debug("cannot read %s for the relay's refusals: %s", self.topic, exc)
            for waiters in self._waiting.values():
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)  # (only the caller's timeout says, then)
        finally:
            if self._live is token:  # (no await since the loop's test: a new waiter starts
                self._live = None  # a new look)
            await stop_soon(consumer)

    async def _from(self, consumer: AIOKafkaConsumer, since_ms: int) -> list[TopicPartition]:
        """Start `consumer` on every dead-letter partition at `since_ms` (the end where no
        record is that late: read before the times, so a copy made meanwhile is read)."""
        await start_client(consumer, self.bootstrap, self.security)
        tps = [TopicPartition(self.topic, p)
               for p in range(await partition_count(consumer, self.topic, self.bootstrap))]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        found = await consumer.offsets_for_times({tp: max(0, since_ms) for tp in tps})
        for tp in tps:
            at = found.get(tp)
            consumer.seek(tp, at.offset if at is not None else ends[tp])
        return tps

    def _answer(self, headers: dict[str, bytes]) -> None:
        source = (headers.get(SOURCE_HEADER) or b"").decode(errors="replace")
        reason = (headers.get(REASON_HEADER) or b"(no reason given)").decode(errors="replace")
        self._read[source] = reason
        while len(self._read) > READ_KEPT:
            del self._read[next(iter(self._read))]
        for waiter in self._waiting.get(source, ()):
            if not waiter.done():
                waiter.set_result(reason)
