"""Updates and batches through the relay under SASL_SSL and ACLs (issue 21 items 2 and 4,
with issue 16 item 12: a restricted authority acts only on runs whose ceiling it covers).

The broker and the namespaces are test_security's: User:client sends on the unrestricted
`<ns>.requests`, User:shop as authority `shop` (which the workers limit to `email`) on
`<ns>.requests.shop`; a worker process runs the demo flows and the relay.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from runstream import Client, UpdateRefused, UpdateRejected
from runstream.engine.broker import BrokerCluster
from runstream.engine.client.placed import Placed
from runstream.engine.config import journal_topic
from runstream.engine.demo.flows import PackingIn, packing, quote
from runstream.engine.journal import JournalRecord, decode
from runstream.engine.journal import events as ev
from runstream.engine.kafka.reader import read_partitions
from runstream.projections.state import RunStatus
from tests.integration.test_security import (
    _client_and_shop,
    _shop_namespace,
    _until_status,
    secure,  # noqa: F401  (the module's SASL_SSL broker, a fixture)
    security_of,
)

pytestmark = [pytest.mark.integration]

TIMEOUT_S = 90.0


def _quote(customer: str) -> dict[str, object]:
    """A demo quote that waits for one `discount` update (at most 30%, says its
    validator), replies with the new price, then waits for `accept`."""
    return {"customer": customer, "region": "eu", "price": 100, "discountable": True}


async def test_a_restricted_authority_updates_only_runs_inside_its_ceiling(
        secure: BrokerCluster, tmp_path: Path) -> None:  # noqa: F811
    """User:shop's update to a run it created (ceiling `email`) goes through the relay and is
    answered (a validator's rejection comes back the same way); to User:client's unrestricted
    run it is refused by the reducer with the authority's reason, and that run never takes
    it: the update User:client then sends on the unrestricted topic is the one it answers."""
    admin = security_of(secure, "admin")
    async with _shop_namespace(secure, tmp_path) as namespace:
        client, shop = _client_and_shop(secure, namespace, tmp_path, [quote])
        async with client, shop:
            await client.create_run(quote, _quote("out"), run_id="q-out")
            for run_id in ("q-in", "q-in-2"):
                await shop.create_run(quote, _quote(run_id), run_id=run_id)
            for run_id in ("q-out", "q-in", "q-in-2"):
                await _until_status(shop, run_id, RunStatus.suspended)
            assert (await shop.describe("q-out")).ceiling is None  # may use anything
            assert (await shop.describe("q-in")).ceiling == ("email",)

            # Inside its ceiling: answered through the relay.
            assert await shop.update("q-in", "discount", {"percent": 10},
                                     timeout=TIMEOUT_S) == {"price": 90.0}
            with pytest.raises(UpdateRejected, match="needs a manager"):
                await shop.update("q-in-2", "discount", {"percent": 50}, timeout=TIMEOUT_S)
            # The unrestricted topic acts on shop's runs too.
            assert await client.update("q-in-2", "discount", {"percent": 20},
                                       timeout=TIMEOUT_S) == {"price": 80.0}

            # Outside it: refused, with the authority named.
            why = ("authority 'shop' (allowed: email) does not cover run q-out, which may use "
                   "any capability")
            with pytest.raises(UpdateRefused, match=re.escape(why)) as refused:
                await shop.update("q-out", "discount", {"percent": 25}, timeout=TIMEOUT_S)
            assert (refused.value.run_id, refused.value.name, refused.value.why) == (
                "q-out", "discount", why)
            state = await client.describe("q-out")
            assert state.status is RunStatus.suspended and state.signals == ()
            # The refused update was never taken: the next one is the run's first.
            assert await client.update("q-out", "discount", {"percent": 5},
                                       timeout=TIMEOUT_S) == {"price": 95.0}
            for run_id in ("q-out", "q-in", "q-in-2"):
                await client.cancel(run_id)

        # As the journal holds them: the relay stamped shop's updates with its authority and
        # left the unrestricted topic's without one.
        journal = [decode(r.value, r.headers) async for r in read_partitions(
            secure.bootstrap, journal_topic(namespace), security=admin)]
        updates = [(r.envelope.run_id, r.authority, tuple(r.authority_capabilities))
                   for r in journal if isinstance(r, ev.RunUpdateRequested)]
        assert sorted(updates, key=repr) == sorted([
            ("q-in", "shop", ("email",)), ("q-in-2", "shop", ("email",)),
            ("q-in-2", None, ()), ("q-out", "shop", ("email",)), ("q-out", None, ())],
            key=repr)
    assert "Traceback" not in (tmp_path / "worker.log").read_text(errors="replace")


async def test_a_restricted_authoritys_batch_cancels_only_runs_inside_its_ceiling(
        secure: BrokerCluster, tmp_path: Path) -> None:  # noqa: F811
    """User:shop's cancel_where makes a batch run whose ceiling is shop's (`email`); its
    cancels carry that ceiling, so the matching runs shop created are cancelled and
    User:client's unrestricted one is reported refused with the batch's authority in the
    reason, and stays as it was; a run the query does not match is left alone. The same
    query from User:client (unrestricted) then cancels it."""
    async with _shop_namespace(secure, tmp_path) as namespace:
        client, shop = _client_and_shop(secure, namespace, tmp_path, [packing])
        async with client, shop:
            def waiting(run_id: str) -> PackingIn:
                return PackingIn(order_id=run_id, seconds=600)

            await client.create_run(packing, waiting("b-out"), run_id="b-out",
                                    attributes={"team": "a"})
            for run_id, team in (("b-in-1", "a"), ("b-in-2", "a"), ("b-other", "b")):
                await shop.create_run(packing, waiting(run_id), run_id=run_id,
                                      attributes={"team": team})
            everything = ("b-out", "b-in-1", "b-in-2", "b-other")
            for run_id in everything:
                await _until_status(client, run_id, RunStatus.suspended)

            batch = await shop.cancel_where("team = 'a'", reason="team a closes",
                                            batch_id="close-a")
            report = await batch.result(timeout=TIMEOUT_S)
            assert (await shop.describe(batch.run_id)).ceiling == ("email",)
            assert (report["matched"], report["done"], report["refused"]) == (3, 2, 1), report
            assert report["refusals"] == [{"run_id": "b-out", "reason": (
                "authority 'batch close-a' (allowed: email) does not cover run b-out, which "
                "may use any capability")}], report
            for run_id in ("b-in-1", "b-in-2"):
                await _until_status(client, run_id, RunStatus.cancelled)
                state = await client.describe(run_id)
                assert (state.cancel_requested, state.cancel_requested_by) == (
                    "team a closes", "batch close-a")
            for run_id in ("b-out", "b-other"):
                state = await client.describe(run_id)
                assert (state.status, state.cancel_requested) == (RunStatus.suspended, None)

            # Unrestricted, the same query cancels b-out (shop's are already over).
            again = await client.cancel_where("team = 'a'", reason="everyone",
                                              batch_id="close-a-all")
            report = await again.result(timeout=TIMEOUT_S)
            assert (report["matched"], report["done"], report["refused"]) == (3, 1, 2), report
            assert {r["run_id"]: r["reason"] for r in report["refusals"]} == {
                "b-in-1": "the run has ended (cancelled)",
                "b-in-2": "the run has ended (cancelled)"}, report
            await _until_status(client, "b-out", RunStatus.cancelled)
            assert (await client.describe("b-other")).status is RunStatus.suspended
            await client.cancel("b-other")
    assert "Traceback" not in (tmp_path / "worker.log").read_text(errors="replace")


async def test_a_relayed_update_is_found_when_the_relay_placed_it_before_the_tail_followed(
        secure: BrokerCluster, tmp_path: Path) -> None:  # noqa: F811
    """A fresh client (its tail follows no partition) whose update the relay places in the
    journal before the client starts looking for it, which a slow first catch-up of the
    client's read model does by itself (here made certain: the client looks only once the
    request is in the journal). The tail then starts from the read model, which holds the
    request: found there, the update's reply is returned."""
    async with _shop_namespace(secure, tmp_path) as namespace:
        client, shop = _client_and_shop(secure, namespace, tmp_path, [quote])
        async with client, shop:
            await shop.create_run(quote, _quote("late"), run_id="q-late")
            await _until_status(shop, "q-late", RunStatus.suspended)
            client.relay_timeout = 10.0
            looks = client._journal_offset

            async def once_placed(placed: Placed, record: JournalRecord) -> int:
                await _until_placed(shop, placed.partition, record)
                return await looks(placed, record)

            client._journal_offset = once_placed  # type: ignore[method-assign]
            assert await client.update("q-late", "discount", {"percent": 10},
                                       timeout=TIMEOUT_S) == {"price": 90.0}


async def _until_placed(reader: Client, partition: int, record: JournalRecord) -> None:
    """Until the relay has put `record` in the journal (as another client's read model
    shows)."""
    env = record.envelope
    for _ in range(120):
        view = await (await reader.read_model()).catch_up([partition])
        if view.request_item(env.run_id, env.request_id or "") is not None:
            return
        await asyncio.sleep(0.25)
    raise AssertionError(f"the relay never put {record.TYPE} {env.request_id} in the journal")
