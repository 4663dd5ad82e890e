"""Two different flows under one name are refused (the last one silently won: runs of the
first went to the second's handler)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runstream import Flow, FlowContext, InvalidInput, Worker
from runstream.engine.flow.apps import flows_by_name
from runstream.engine.testing import TestEnvironment

first: Flow[Any, Any] = Flow("dup")
second: Flow[Any, Any] = Flow("dup")


@first.handler
async def _first(ctx: FlowContext, payload: Any) -> Any:
    return "first"


@second.handler
async def _second(ctx: FlowContext, payload: Any) -> Any:
    return "second"


def test_two_flows_under_one_name_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="two different flows are named 'dup'"):
        flows_by_name([first, second])
    with pytest.raises(InvalidInput, match="two different flows are named 'dup'"):
        Worker(flows=[first, second], data_dir=tmp_path / "w",
               bootstrap_servers="127.0.0.1:1")
    with pytest.raises(InvalidInput, match="two different flows are named 'dup'"):
        TestEnvironment(flows=[first, second])  # (as the worker: the same owner code)
    assert flows_by_name([first, first]) == {"dup": first}  # (the same one twice: one)

