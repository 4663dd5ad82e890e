"""The pipe frames of engine.journal.frames: what frame() writes read_frame() reads back, and
a pipe that ends inside a frame reads as ended, not as a shorter frame."""

from __future__ import annotations

import asyncio
import io

from runstream.engine.journal.frames import ENDED, HEAD, frame, read_frame, read_frame_async


def test_frames_read_back_in_order_then_the_end() -> None:
    pipe = io.BytesIO(frame(b"C", b"chunk") + frame(b"S", b"") + frame(b"E", b"x" * 70_000))
    assert read_frame(pipe) == (b"C", b"chunk")
    assert read_frame(pipe) == (b"S", b"")
    assert read_frame(pipe) == (b"E", b"x" * 70_000)
    assert read_frame(pipe) == (ENDED, b"")


def test_a_pipe_that_ends_inside_a_frame_reads_as_ended() -> None:
    whole = frame(b"B", b"payload")
    for cut in (1, HEAD.size - 1, HEAD.size, len(whole) - 1):
        assert read_frame(io.BytesIO(whole[:cut])) == (ENDED, b"")


def test_an_asyncio_stream_reads_the_same_frames_and_the_same_end() -> None:
    whole = frame(b"C", b"chunk") + frame(b"S", b"x" * 70_000)

    async def read(data: bytes, count: int) -> list[tuple[bytes, bytes]]:
        stream = asyncio.StreamReader()
        stream.feed_data(data)
        stream.feed_eof()
        return [await read_frame_async(stream) for _ in range(count)]

    assert asyncio.run(read(whole, 3)) == [(b"C", b"chunk"), (b"S", b"x" * 70_000),
                                           (ENDED, b"")]
    for cut in (1, HEAD.size - 1, HEAD.size, len(whole) - 1):
        ended = asyncio.run(read(whole[:cut], 2))[-1]
        assert ended == (ENDED, b"")
