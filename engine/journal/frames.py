"""Frames a process and the child process it starts pass through a pipe: a kind byte, a
4-byte big-endian length, the payload. The decode-ahead child (engine.kafka.decode_ahead)
and the snapshot reader (engine.worker.snapshot_reader) send theirs so; what each kind
means is theirs to say."""

from __future__ import annotations

import asyncio
import struct
from typing import IO

HEAD = struct.Struct(">cI")
ENDED = b""  # read_frame's kind when the pipe ends before a whole frame


def frame(kind: bytes, payload: bytes) -> bytes:
    return HEAD.pack(kind, len(payload)) + payload


def read_frame(frames: IO[bytes]) -> tuple[bytes, bytes]:
    """The next frame (kind, payload); (ENDED, b"") when the pipe ends before one."""
    head = frames.read(HEAD.size)
    if len(head) < HEAD.size:
        return ENDED, b""
    kind, size = HEAD.unpack(head)
    payload = frames.read(size)
    return (kind, payload) if len(payload) == size else (ENDED, b"")


async def read_frame_async(frames: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """read_frame() from an asyncio stream (a child process's stdout)."""
    try:
        kind, size = HEAD.unpack(await frames.readexactly(HEAD.size))
        return kind, await frames.readexactly(size)
    except asyncio.IncompleteReadError:
        return ENDED, b""
