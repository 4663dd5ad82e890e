"""`runstream topics …`: create and check a namespace's topics."""

from __future__ import annotations

import asyncio
import logging

import click

from runstream.engine.cli.errors import UserError
from runstream.engine.config import DEFAULT_PARTITIONS, resolve_bootstrap, resolve_namespace
from runstream.engine.journal.input_limits import check_authority_name
from runstream.engine.kafka.admin import TopicsError, ensure_requests_topics, ensure_topics


@click.group()
def topics() -> None:
    """Create and check runstream's Kafka topics."""


@topics.command()
@click.option("--partitions", type=click.IntRange(min=1), default=DEFAULT_PARTITIONS,
              show_default=True, help="Partitions of the journal (fixed once created).")
@click.option("--replication-factor", type=click.IntRange(min=1), default=None,
              help="Replicas per partition [default: min(3, brokers in the cluster)].")
@click.option("--namespace", default=None,
              help="Topic prefix [default: $RUNSTREAM_NAMESPACE or runstream].")
@click.option("--bootstrap", default=None,
              help="Kafka address [default: $RUNSTREAM_BOOTSTRAP or 127.0.0.1:9092].")
@click.option("--requests", "with_requests", is_flag=True,
              help="Also create <namespace>.requests (with the journal's partition count): "
              "clients then send requests there and the workers relay them.")
@click.option("--authority", "authorities", multiple=True, metavar="NAME",
              help="With --requests: also <namespace>.requests.NAME for a restricted "
              "authority (repeatable).")
def create(
    partitions: int, replication_factor: int | None, namespace: str | None,
    bootstrap: str | None, with_requests: bool, authorities: tuple[str, ...],
) -> None:
    """Create <namespace>.journal, .owners and .dead-letter unless they exist (with
    --requests, the requests topics too).

    Existing topics are checked, not changed: a different partition count or config is an
    error naming each difference.
    """
    if authorities and not with_requests:
        raise UserError("--authority NAME goes with --requests")
    for name in authorities:
        check_authority_name(name)
    address = resolve_bootstrap(bootstrap)
    # aiokafka logs each failed connection attempt; the failure is reported once, below.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        report = asyncio.run(
            ensure_topics(address, resolve_namespace(namespace), partitions, replication_factor)
        )
    except TopicsError as exc:
        raise UserError(str(exc)) from exc
    for result in report.topics:
        if result.ok:
            click.echo(result.summary())
    if not report.ok:
        raise UserError(" | ".join(report.mismatches()))
    if with_requests:
        try:
            made = asyncio.run(ensure_requests_topics(
                address, report.namespace, list(authorities),
                replication_factor=replication_factor))
        except TopicsError as exc:
            raise UserError(str(exc)) from exc
        for topic in made:
            click.echo(topic.summary())
