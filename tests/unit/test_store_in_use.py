"""A store another process (or another object of this one) holds open is refused in one
line, StoreInUse: rocksdict raised a bare Exception, and `runstream worker` on a data dir a
draining worker still held printed a traceback of 48 lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runstream import StoreInUse
from runstream.projections.store import ProjectionStore


def test_a_second_open_of_a_store_is_refused_in_one_line(tmp_path: Path) -> None:
    held = ProjectionStore(tmp_path / "projection")
    try:
        with pytest.raises(StoreInUse, match=r"projection is in use: another worker or read "
                                             r"model \(or this process\) has it open"):
            ProjectionStore(tmp_path / "projection")
    finally:
        held.close()
    ProjectionStore(tmp_path / "projection").close()  # (free again once closed)


def test_a_worker_on_a_data_dir_in_use_exits_with_one_error_line(tmp_path: Path) -> None:
    held = ProjectionStore(tmp_path / "w" / "projection")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "runstream", "worker", "--app",
             "runstream.engine.demo.flows:flows", "--data-dir", str(tmp_path / "w"),
             "--bootstrap", "127.0.0.1:1"], capture_output=True, text=True, timeout=120)
    finally:
        held.close()
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("error: ") and "projection is in use" in lines[-1], lines
    assert "Traceback" not in done.stderr
