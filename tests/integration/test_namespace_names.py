"""A namespace inside another's grants (rv22d): a worker's ACLs are prefixed `<ns>.`, so a
namespace `<ns>.eu` had its journal writable by `<ns>`'s workers. New namespaces' names hold
no "."; granting the worker role where another namespace's topics start with `<ns>.` is
refused (a namespace made before the rule)."""

from __future__ import annotations

import pytest
from aiokafka.admin import NewTopic

from runstream.engine.errors import InvalidInput
from runstream.engine.kafka.acl import foreign, grant_role
from runstream.engine.kafka.admin import TopicsError, admin_client, delete_topics, ensure_topics
from tests.integration.support import until

pytestmark = pytest.mark.integration


async def test_a_namespace_inside_another_s_grants_is_refused(
    bootstrap: str, namespace: str, journal: str
) -> None:
    with pytest.raises(TopicsError, match=r"a new namespace's name holds no '\.'"):
        await ensure_topics(bootstrap, f"{namespace}.eu", partitions=1)
    inner = f"{namespace}.eu.journal"  # (as a release before the rule could make it)
    async with admin_client(bootstrap, 30.0, None) as admin:
        await admin.create_topics([NewTopic(inner, 1, 1)])
        # (a namespace made long ago: its topic listed, as the broker's metadata has it once
        # the creation reached it; asked at once, one CI run found it not listed yet)

        async def listed() -> bool:
            return inner in await admin.list_topics()
        await until(listed, f"{inner} listed", timeout=30)
    try:
        with pytest.raises(InvalidInput, match=f"{inner} belongs to another namespace"):
            await grant_role(bootstrap=bootstrap, role="worker", principal="User:worker",
                             namespace=namespace)
        # the client role's grants are literal: nothing else is inside them
        with pytest.raises(InvalidInput, match="No Authorizer is configured"):
            await grant_role(bootstrap=bootstrap, role="client", principal="User:client",
                             namespace=namespace)
    finally:
        await delete_topics(bootstrap, f"{namespace}.eu")


def test_a_namespace_s_own_topics_are_not_foreign() -> None:
    for own in ("journal", "owners", "dead-letter", "snapshots", "requests", "requests.shop"):
        assert not foreign("rv", f"rv.{own}")
    for other in ("rv.eu.journal", "rv.requests.shop.x", "rv.x"):
        assert foreign("rv", other)
    assert not foreign("rv", "rvx.journal") and not foreign("rv", "other.journal")
