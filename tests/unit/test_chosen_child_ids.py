"""A child's chosen id is held to a client's rules (characters, length, not a round's id),
in the owner code the worker and TestEnvironment share, by Flow object and by flow name."""

from __future__ import annotations

import pytest

from runstream import RunFailed
from runstream.engine.testing import TestEnvironment
from tests.integration.child_id_flows import ACCEPTED, REFUSED, chooser, flows


@pytest.mark.parametrize("by_name", [False, True], ids=["flow", "name"])
async def test_a_child_id_no_client_could_address_is_refused(by_name: bool) -> None:
    async with TestEnvironment(flows) as env:
        for n, (child_id, why) in enumerate(REFUSED.items()):
            await env.start(chooser.name if by_name else chooser, child_id, run_id=f"p{n}")
            with pytest.raises(RunFailed, match="SpawnRefused") as failed:
                await env.result(f"p{n}", follow=True)
            assert why in str(failed.value)
            assert env.describe(f"p{n}").children == ()  # nothing was spawned


@pytest.mark.parametrize("by_name", [False, True], ids=["flow", "name"])
async def test_a_valid_chosen_child_id_is_kept(by_name: bool) -> None:
    async with TestEnvironment(flows) as env:
        for n, child_id in enumerate(ACCEPTED):
            await env.start(chooser.name if by_name else chooser, child_id, run_id=f"p{n}")
            assert await env.result(f"p{n}", follow=True) == f"child {child_id}"
