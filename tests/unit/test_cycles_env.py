"""A spawn naming an ancestor by its lineage id, once that ancestor handed off, is a cycle
(FlowCycleDetected), as naming it by its run id is; it was refused as a run that exists
(tests/integration/test_waits.py: the same on a worker)."""

from __future__ import annotations

import pytest

from runstream import RunFailed
from runstream.testing import TestEnvironment
from tests.integration.waiting_flows import cycle


async def test_a_child_naming_its_grandparent_s_lineage_is_a_cycle() -> None:
    async with TestEnvironment([cycle], partitions=4) as env:
        await env.start(cycle, {"spawn_as": "mid", "back": "hop", "hop": True}, run_id="hop")
        with pytest.raises(RunFailed, match="FlowCycleDetected") as caught:
            await env.result("hop", follow=True)
        assert "hop~1 -> mid -> hop" in str(caught.value)
