"""A create request naming a round of a lineage (`n~1`), as only a plain producer writes
it to the journal (a client, the CLI and the relay refuse it before it gets there): its
owner rejects it, saying why, and the partition goes on. Made, it was a round a handoff of
`n` would later take over."""

from __future__ import annotations

from pathlib import Path

from runstream.engine.journal import events as ev
from tests.integration.support import fold, until
from tests.integration.test_gathered_waits import napper
from tests.integration.test_lifetime import plain_request, produce_plain, ready_with_doors


async def test_a_plain_producer_s_create_of_a_round_id_is_rejected_by_its_owner(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    async with ready_with_doors(bootstrap, namespace, journal, tmp_path,
                                [napper]) as (_, client, create):
        value = plain_request("run.create-requested", "n~1", lineage_id="n",
                              flow=napper.name, payload_json="0")
        await produce_plain(bootstrap, journal, "n", value)  # (keyed by its lineage)

        async def rejected() -> list[str]:
            history = (await fold(bootstrap, namespace)).history.get("n~1", [])
            return [i.record.reason for i in history
                    if isinstance(i.record, ev.RunCreateRejected)]
        await until(rejected, "the owner answered the create", timeout=60, every=0.5)
        assert await rejected() == ["run-id-invalid"]
        await create("producer")(napper, 0, "n")  # (the lineage itself is made as ever)
        assert await client.get_handle("n").result(timeout=60) == 0
