"""`runstream acl grant`: the least ACLs a worker or a client principal needs (engine/kafka/acl)."""

from __future__ import annotations

import click

from runstream.engine.cli.eventloop import run_async
from runstream.engine.cli.options import bootstrap_option, namespace_option, print_json
from runstream.engine.config import resolve_bootstrap
from runstream.engine.kafka.acl import ROLES, grant_role


@click.group()
def acl() -> None:
    """Grant Kafka ACLs per runstream role (as the broker's super user)."""


@acl.command()
@click.option("--role", type=click.Choice(ROLES), required=True,
              help="worker: every <ns>. topic and group; client: write <ns>.requests, read "
              "the journal, owners and snapshots.")
@click.option("--principal", required=True, help="Kafka principal, e.g. User:client.")
@click.option("--authority", default=None,
              help="Client role: write <ns>.requests.<authority> instead of <ns>.requests.")
@namespace_option
@bootstrap_option
@click.option("--json", "as_json", is_flag=True, help="Print the ACLs granted as JSON.")
def grant(role: str, principal: str, authority: str | None, namespace: str | None,
          bootstrap: str | None, as_json: bool) -> None:
    """Grant ROLE's ACLs to PRINCIPAL; connect as an administrator (the group's SASL options
    or RUNSTREAM_* variables)."""
    bindings = run_async(grant_role(
        bootstrap=resolve_bootstrap(bootstrap), role=role, principal=principal,
        namespace=namespace, authority=authority))
    if as_json:
        print_json([{"principal": b.principal, "resource": b.resource, "name": b.name,
                     "pattern": b.pattern, "operation": b.operation} for b in bindings])
        return
    for binding in bindings:
        click.echo(f"granted {binding.describe()}")
