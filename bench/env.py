"""What every benchmark shares: the broker, fresh namespaces (deleted afterwards), options."""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from runstream.engine.config import journal_topic
from runstream.engine.kafka.admin import TopicsError, delete_topics, ensure_topics

T = TypeVar("T")


@dataclass
class Context:
    bootstrap: str
    quick: bool
    prefix: str
    results_dir: Path
    broker_pid: int | None
    # W1 runs/s by worker count, measured earlier in this invocation (latency runs at half).
    runs_per_s: dict[int, float] = field(default_factory=dict)

    def pids(self) -> dict[str, int | None]:
        return {"broker": self.broker_pid, "bench": os.getpid()}

    def new_namespace(self, tag: str) -> str:
        return f"{self.prefix}-{tag}-{uuid.uuid4().hex[:8]}"


def pick(args: argparse.Namespace, name: str, full: T, quick: T) -> T:
    """The option's value if given, else the full or the --quick default."""
    value = getattr(args, name, None)
    if value is not None:
        return value  # type: ignore[no-any-return]
    return quick if getattr(args, "quick", False) else full


@asynccontextmanager
async def fresh_namespace(ctx: Context, tag: str, partitions: int) -> AsyncIterator[str]:
    """A namespace no one else uses, with its topics; the topics are deleted afterwards."""
    namespace = ctx.new_namespace(tag)
    report = await ensure_topics(ctx.bootstrap, namespace, partitions=partitions)
    if not report.ok:
        raise TopicsError("; ".join(report.mismatches()))
    try:
        yield namespace
    finally:
        try:
            await delete_topics(ctx.bootstrap, namespace)
        except TopicsError as exc:
            print(f"warning: topics of {namespace} not deleted: {exc}", file=sys.stderr)


@asynccontextmanager
async def fresh_topic(ctx: Context, tag: str, partitions: int) -> AsyncIterator[str]:
    """A fresh namespace's journal topic, for raw-Kafka limits; deleted afterwards."""
    async with fresh_namespace(ctx, tag, partitions) as namespace:
        yield journal_topic(namespace)

