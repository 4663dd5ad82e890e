"""`runstream topics …`: create and check a namespace's topics, set the journal's retention."""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import click

from runstream.engine.cli.errors import UserError
from runstream.engine.cli.eventloop import run_async
from runstream.engine.cli.options import bootstrap_option, namespace_option, print_json
from runstream.engine.config import (
    DEFAULT_PARTITIONS,
    requests_topic,
    resolve_bootstrap,
    resolve_namespace,
)
from runstream.engine.journal.input_limits import check_authority_name
from runstream.engine.kafka.admin import (
    RequestsTopic,
    TopicReport,
    ensure_requests_topics,
    ensure_topics,
)
from runstream.engine.kafka.journal_retention import (
    Standings,
    alter_journal_retention,
    journal_retention_ms,
)
from runstream.engine.ops.snapshots import snapshot_standings
from runstream.projections.snapshot_horizon import duration_text

_RETENTION_HELP = ("How long the journal keeps records: 30d, 12h, ... or 0/forever "
                   "[default: forever]. Finite only when every partition has a snapshot "
                   "newer than now minus it (`topics alter`).")


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
@click.option("--journal-retention", "retention", default="forever", metavar="DURATION",
              show_default=True, help=_RETENTION_HELP)
@click.option("--json", "as_json", is_flag=True,
              help="Print each topic as JSON (a difference is still an error, after it).")
def create(
    partitions: int, replication_factor: int | None, namespace: str | None,
    bootstrap: str | None, with_requests: bool, authorities: tuple[str, ...], retention: str,
    as_json: bool,
) -> None:
    """Create <namespace>.journal, .owners, .dead-letter and .snapshots unless they exist
    (with --requests, the requests topics too).

    Existing topics are checked, not changed (a missing .snapshots is added): a different
    partition count or config is an error naming each difference. A namespace that opted
    into a journal retention names it again with --journal-retention.
    """
    if authorities and not with_requests:
        raise UserError("--authority NAME goes with --requests")
    space = resolve_namespace(namespace)
    for name in authorities:  # (every topic's name checked before any is made)
        requests_topic(space, check_authority_name(name))
    retention_ms = _retention_ms(retention)
    address = resolve_bootstrap(bootstrap)
    # aiokafka logs each failed connection attempt; the failure is reported once (run_cli).
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    report = run_async(ensure_topics(
        address, space, partitions, replication_factor,
        journal_retention_ms=retention_ms))
    for result in report.topics:
        if result.ok and not as_json:
            click.echo(result.summary())
    made = (_requests_topics(address, report.namespace, authorities, replication_factor)
            if with_requests and report.ok else [])
    if as_json:
        print_json(_report_json(report, made))
    if not report.ok:
        have = report.journal.configs.get("retention.ms", str(retention_ms))
        # (a --journal-retention given that the journal does not have: only alter changes it)
        given = (click.get_current_context().get_parameter_source("retention")
                 is not click.core.ParameterSource.DEFAULT)
        how = ("change it with `runstream topics alter`" if given else
               "name it with --journal-retention, or change it with `runstream topics alter`")
        hint = ("" if have == str(retention_ms) else f" (the journal's retention is "
                f"{duration_text(int(have))}: {how})")
        raise UserError(" | ".join(report.mismatches()) + hint)
    if not as_json:
        for topic in made:
            click.echo(topic.summary())


def _requests_topics(address: str, namespace: str, authorities: tuple[str, ...],
                     replication_factor: int | None) -> list[RequestsTopic]:
    return run_async(ensure_requests_topics(address, namespace, list(authorities),
                                            replication_factor=replication_factor))


def _report_json(report: TopicReport, made: list[RequestsTopic]) -> dict[str, Any]:
    return {"bootstrap": report.bootstrap, "namespace": report.namespace, "ok": report.ok,
            "topics": [{"name": t.name, "created": t.created, "partitions": t.partitions,
                        "replication_factor": t.replication_factor, "configs": t.configs,
                        "mismatches": list(t.mismatches)} for t in report.topics],
            "requests_topics": [{"name": t.name, "created": t.created,
                                 "partitions": t.partitions} for t in made]}


@topics.command()
@click.option("--journal-retention", "retention", required=True, metavar="DURATION",
              help=_RETENTION_HELP)
@namespace_option
@bootstrap_option
@click.option("--json", "as_json", is_flag=True, help="Print the change as JSON.")
def alter(retention: str, namespace: str | None, bootstrap: str | None, as_json: bool) -> None:
    """Set the journal's retention.ms: a finite one only when every partition has a
    complete, anchored snapshot newer than the new horizon (now - DURATION); 0 or forever
    keeps every record again (records already deleted stay deleted)."""
    _retention_ms(retention)  # a bad duration fails before any connection
    address, space = resolve_bootstrap(bootstrap), resolve_namespace(namespace)
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    change = run_async(alter_journal_retention(
        address, space, retention, security=None, standings=_snapshot_standings(address, space),
        now_ms=int(time.time() * 1000)))
    if as_json:
        print_json(change.as_json())
    else:
        click.echo(change.summary())


def _retention_ms(text: str) -> int:
    try:
        return journal_retention_ms(text)
    except ValueError as exc:
        raise UserError(f"--journal-retention: {exc}") from exc


def _snapshot_standings(bootstrap: str, namespace: str) -> Standings:
    """Each partition's newest snapshot as `topics alter` judges it (engine.ops.snapshots):
    anchored in the journal, complete and intact in <ns>.snapshots."""
    return functools.partial(snapshot_standings, bootstrap, namespace)
