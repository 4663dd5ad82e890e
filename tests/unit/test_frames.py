"""The pipe frames of engine.journal.frames: what frame() writes read_frame() reads back, and
a pipe that ends inside a frame reads as ended, not as a shorter frame."""

from __future__ import annotations

import io

from runstream.engine.journal.frames import ENDED, HEAD, frame, read_frame


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
