"""A BaseException of the user's code on a worker against a real broker, for runs created
through every door: sys.exit in a plain or async step fails the step (StepFailed, its
error type SystemExit), sys.exit in the handler fails the run, and a CancelledError of a
task the handler awaited fails the run. Before, the first two ended the worker's event loop
(and would end every next owner's: the step's outcome was never journaled), and the last
left the run running with no handler. The worker completes another run after them all."""

from __future__ import annotations

from pathlib import Path

import pytest

from runstream import RunFailed, RunStatus
from runstream.engine.demo.flows import checkout
from tests.integration.test_lifetime import DOORS, ready_with_doors
from tests.integration.user_exit_flows import OUTCOMES, exiting


async def test_a_users_base_exception_fails_its_run_through_every_door(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with ready_with_doors(bootstrap, namespace, journal, tmp_path,
                                [exiting, checkout]) as (_, client, create):
        for door in DOORS:
            for mode in OUTCOMES:
                await create(door)(exiting, mode, f"{mode}-{door}")
        for door in DOORS:
            for mode, (error_type, detail) in OUTCOMES.items():
                handle = client.get_handle(f"{mode}-{door}")
                if error_type is None:
                    assert await handle.result(timeout=60) == detail
                    continue
                with pytest.raises(RunFailed) as failed:
                    await handle.result(timeout=60)
                assert (failed.value.error_type, door) == (error_type, door)
                assert detail in failed.value.message
                assert (await client.describe(f"{mode}-{door}")).status is RunStatus.failed
        after = await client.create_run(checkout, {"order_id": "o-1", "amount": 5})
        assert dict(await after.result(timeout=60))["reservation"] == "res-o-1-5"
