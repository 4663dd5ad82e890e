"""Decode ahead: a second process reads and decodes the journal while this one folds it.

A fold is bound by one core: consuming and decoding a record (aiokafka, fastavro) costs about
as much as applying and writing it. On a backlog of at least `DECODE_AHEAD_MIN` records a
fold reads through a child process (`python -m runstream.engine.kafka.decode_ahead`): it
reads the same partitions and offsets with its own consumer (engine.kafka.reader), examines
each record as every reader does (projections.poison.examine) and writes frames of decoded
records to its stdout (engine.journal.transfer); this process rebuilds them in C and folds.
The records, their order and what each one is (a poison one is sent as its bytes and
examined here) are those an in-process read would give, so the fold's state and running
hash are the same (tests/integration/test_decode_ahead.py).

Frames on the child's stdout (engine.journal.frames: one kind byte, a 4-byte big-endian
length, the payload):
  B  a batch: engine.journal.transfer.encode_frame's rows, one partition's, in offset order
  E  an error: the exception pickled (or its text, as a RunstreamError), then the child ends
  D  done: every record up to the limits was sent
The child's stderr is this process's (its log lines). Each side moves frames through the
pipe in a thread of its own (the pipe's reads and writes release the GIL), so that neither
waits for the other's computing: the child examines the next poll while its last frame goes
out, and this process folds one frame while the next comes in. Bounds: FRAMES_AHEAD frames
(FRAME_RECORDS records at most each) wait in the child, one frame is read ahead here; the
child goes (killed if need be) when the fold ends, however it ends.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncGenerator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO

from runstream.engine.errors import RunstreamError
from runstream.engine.journal.frames import frame, read_frame
from runstream.engine.journal.settings import env_count
from runstream.engine.journal.transfer import (
    NOT_SENT,
    Headers,
    Outgoing,
    class_index,
    decode_frame,
    encode_frame,
)
from runstream.engine.kafka.connection import KafkaSecurity
from runstream.engine.kafka.reader import Polled, read_batches
from runstream.projections.poison import KEY_UNKNOWN, Examined, FoldRow, Poison, examine

# Records below which a fold reads in process: a child costs about 0.3 s to start (imports,
# its consumer, its first poll) and saves about 7 us a record on this 2-core machine; at
# 70,000 records the two ways came out even (docs/performance.md).
DECODE_AHEAD_MIN = 100_000
FRAMES_AHEAD = 16
FRAME_RECORDS = 1000  # records a frame at most (the first ones go out sooner)
_MODULE = "runstream.engine.kafka.decode_ahead"
_BATCH, _ERROR, _DONE = b"B", b"E", b"D"
# One child at a time in a process: a second would share the same spare core.
_running = 0


@dataclass(frozen=True, slots=True)
class ReadSpec:
    """What the child reads: read_batches' arguments. Every record's bytes go with it (a
    decision about a run that never existed is a dead letter the fold keeps and hashes
    whole, and only the fold knows which runs exist)."""

    bootstrap: str
    topic: str
    partitions: list[int] | None
    start: dict[int, int]
    until: dict[int, int] | None
    security: KafkaSecurity | None


def decode_ahead_min() -> int:
    """RUNSTREAM_DECODE_AHEAD_MIN: the backlog (records) from which a fold decodes ahead in
    a second process; 0 never does."""
    return env_count("RUNSTREAM_DECODE_AHEAD_MIN", DECODE_AHEAD_MIN, unit="records",
                     zero="never")


def available() -> bool:
    """Whether this process may start a decode-ahead child now (none is running)."""
    return _running == 0


class DecodeAhead:
    """A child process reading and decoding `spec`, started at once (so that it boots while
    the caller opens its store); `batches()` hands out what it sends, `close()` ends it."""

    def __init__(self, spec: ReadSpec) -> None:
        global _running
        self._child = subprocess.Popen([sys.executable, "-m", _MODULE], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE)
        try:
            assert self._child.stdin is not None
            self._child.stdin.write(pickle.dumps(spec))
            self._child.stdin.close()
        except BaseException:
            self._child.kill()
            self._child.wait()
            raise
        _running += 1
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="runstream-decode-ahead")
        self._closed = False

    async def batches(self) -> AsyncGenerator[list[FoldRow], None]:
        """The records of the spec, examined, in batches (one partition's, in offset order)."""
        loop = asyncio.get_running_loop()
        frames = self._child.stdout
        assert frames is not None
        pending = loop.run_in_executor(self._reader, read_frame, frames)
        while True:
            kind, payload = await pending
            if kind == _BATCH:
                pending = loop.run_in_executor(self._reader, read_frame, frames)  # (the next)
                yield [(p, o, t, value, record if record is not None else _examined(
                            value, headers, key)) for p, o, t, key, value, headers, record
                       in decode_frame(payload)]
            elif kind == _DONE:
                return
            elif kind == _ERROR:
                raise _error(payload)
            else:
                raise RunstreamError(f"the decode-ahead reader ended (exit code "
                                     f"{self._child.wait()}) before it had sent every "
                                     f"record (what it printed, if anything, is above)")

    @property
    def running(self) -> bool:
        """Whether the child process is still there."""
        return self._child.poll() is None

    def close(self) -> None:
        """End the child (killed if it still runs) and the reader thread."""
        global _running
        if self._closed:
            return
        self._closed = True
        _running -= 1
        if self._child.poll() is None:
            self._child.kill()  # (a read under way in the reader thread ends: the pipe closes)
        self._child.wait()
        self._reader.shutdown(wait=True)
        if self._child.stdout is not None:
            self._child.stdout.close()


def _examined(value: bytes | None, headers: Headers | None, key: bytes | None) -> Examined:
    """A record the child sent without its fields, examined here: a poison one (sent with
    its key and headers), or one msgspec could not rebuild (the child checked its key and
    headers already, and sent neither)."""
    if headers is None:
        return examine(value, None, KEY_UNKNOWN)
    return examine(value, headers, key)


def _error(payload: bytes) -> BaseException:
    try:
        error = pickle.loads(payload)
    except Exception:  # its class could not be rebuilt: the text it sent
        return RunstreamError(payload.decode(errors="replace"))
    return error if isinstance(error, BaseException) else RunstreamError(str(error))


# -- the child -------------------------------------------------------------------------------------


async def _serve(spec: ReadSpec, frames: queue.Queue[bytes | None]) -> None:
    async for batch in read_batches(spec.bootstrap, spec.topic, spec.partitions,
                                    start=spec.start, until=spec.until,
                                    security=spec.security):
        for at in range(0, len(batch), FRAME_RECORDS):
            rows = _rows(batch[at:at + FRAME_RECORDS])
            frames.put(frame(_BATCH, encode_frame(rows)))  # (waits while FRAMES_AHEAD wait)
    frames.put(frame(_DONE, b""))


def _rows(batch: Sequence[Polled]) -> list[Outgoing]:
    rows: list[Outgoing] = []
    for m in batch:
        examined = examine(m.value, m.headers, m.key, (m.partition, m.offset))
        if examined.__class__ is Poison:
            rows.append((m.partition, m.offset, m.timestamp, m.key, m.value,
                         list(m.headers or ()), NOT_SENT, None))
        else:
            rows.append((m.partition, m.offset, m.timestamp, None, m.value, None,
                         class_index(examined), examined))  # type: ignore[arg-type]
    return rows


def _write_frames(frames: queue.Queue[bytes | None], out: IO[bytes]) -> None:
    try:
        while (frame := frames.get()) is not None:
            out.write(frame)
        out.flush()
    except OSError:
        # The fold is gone (its process died without ending this one): so is this process,
        # whatever its reader is doing (it may be waiting for room in the queue).
        os._exit(1)


def _pickled(error: BaseException) -> bytes:
    try:
        payload = pickle.dumps(error)
        pickle.loads(payload)  # (an exception whose __init__ takes other arguments fails here)
        return payload
    except Exception:
        return f"{type(error).__name__}: {error}".encode()


def _child_main() -> None:
    # The fold ends this process (Ctrl-C reaches it, not this one); its broker errors come
    # back to the fold as one exception, not as aiokafka's log lines.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    spec = pickle.loads(sys.stdin.buffer.read())
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout = sys.stderr  # stdout is the frames' pipe: anything printed goes to stderr
    frames: queue.Queue[bytes | None] = queue.Queue(maxsize=FRAMES_AHEAD)
    writer = threading.Thread(target=_write_frames, args=(frames, out), daemon=True)
    writer.start()
    try:
        asyncio.run(_serve(spec, frames))
    except Exception as exc:
        frames.put(frame(_ERROR, _pickled(exc)))
    frames.put(None)
    writer.join()


if __name__ == "__main__":
    _child_main()
