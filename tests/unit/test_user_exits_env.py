"""A BaseException of the user's code (sys.exit in a step or the handler, a CancelledError
of a task the handler awaited) fails its step or its run in the TestEnvironment, through
the runner a worker uses: it ended the event loop, or left the run running for ever."""

from __future__ import annotations

import pytest

from runstream import RunFailed, RunStatus
from runstream.testing import TestEnvironment
from tests.integration.user_exit_flows import OUTCOMES, exiting


@pytest.mark.parametrize("mode", sorted(OUTCOMES))
async def test_a_users_base_exception_fails_its_run_not_the_loop(mode: str) -> None:
    error_type, detail = OUTCOMES[mode]
    async with TestEnvironment([exiting]) as env:
        if error_type is None:
            assert await env.run(exiting, mode, run_id=mode) == detail
            return
        with pytest.raises(RunFailed) as failed:
            await env.run(exiting, mode, run_id=mode)
        assert failed.value.error_type == error_type
        assert detail in failed.value.message
        assert env.status(mode) is RunStatus.failed
