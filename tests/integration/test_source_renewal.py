"""A produce error the producer does not retry ends the worker's source: it takes a new
source id, claims its partitions again, and never re-sends under the old one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from runstream import Client, Flow, FlowContext, RunFailed, Worker
from runstream.engine.demo.flows import checkout
from runstream.engine.journal import events as ev
from runstream.engine.kafka.admin import topic_specs
from runstream.projections.state import Verdict
from tests.integration.support import fold

huge: Flow[Any, str] = Flow("huge")


@huge.handler
async def run_huge(ctx: FlowContext, p: Any) -> str:
    text = await ctx.step("make", lambda: "x" * 50_000)  # over the topic's record limit
    return text[:10]


async def _limit_records(bootstrap: str, topic: str, max_bytes: int) -> None:
    # (AlterConfigs replaces every config set on the topic: the journal's own are named again,
    # where without them it stamped CreateTime and kept 7 days, which a worker refuses)
    [spec] = [s for s in topic_specs(topic.removesuffix(".journal"), 1, 1) if s.name == topic]
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(
            ConfigResourceType.TOPIC, topic,
            configs={**spec.configs, "max.message.bytes": str(max_bytes)})])
    finally:
        await admin.close()


async def test_a_refused_record_renews_the_source_and_fails_only_its_run(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    await _limit_records(bootstrap, journal, 20_000)
    w = Worker(flows=[checkout, huge], data_dir=tmp_path / "w", bootstrap_servers=bootstrap,
               namespace=namespace, name="w", session_timeout_ms=6000)
    await w.start()
    try:
        async with Client(bootstrap_servers=bootstrap, namespace=namespace,
                          flows=[checkout, huge]) as client:
            ok = await client.create_run(checkout, {"order_id": "a", "amount": 1}, run_id="a")
            await ok.result(timeout=60)
            first_source = w.source_id
            bad = await client.create_run(huge, None, run_id="big")
            with pytest.raises(RunFailed) as failed:
                await bad.result(timeout=60)
            after = await client.create_run(checkout, {"order_id": "b", "amount": 2},
                                            run_id="b")
            assert (await after.result(timeout=60)).order_id == "b"
    finally:
        await w.stop()
    assert failed.value.error_type == "RecordRefused"
    assert "MessageSizeTooLarge" in failed.value.message
    assert w.source_id != first_source
    projection = await fold(bootstrap, namespace)
    claims = [(item.record.envelope.source_id, item.verdict)
              for items in projection.partition_history.values() for item in items
              if isinstance(item.record, ev.PartitionEpochClaimed)]
    sources = {source for source, _ in claims}
    assert sources == {first_source, w.source_id}  # claimed again under the new source
    assert {verdict for _, verdict in claims} == {Verdict.applied}
