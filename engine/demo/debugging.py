"""The demo's time-travel debugging part: a lineage's tree, a diff between two points, a
fork that re-runs only what came after its point, and a dry run of the next deploy."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from runstream.engine.client.client import Client
from runstream.engine.ops.verify import verify
from runstream.engine.readmodel.view import View
from runstream.engine.timetravel.cut import state_of_model
from runstream.engine.timetravel.dryrun import dry_run, format_dry_run
from runstream.engine.timetravel.fork import fork_run
from runstream.engine.timetravel.points import Point, format_diff, run_diff, run_tree
from runstream.projections.replay import iso

Echo = Callable[[str], None]


async def show_debugging(client: Client, view: View, *, bootstrap: str, namespace: str,
                         echo: Echo) -> None:
    echo("\ntime-travel debugging")
    tree = run_tree(view, "sub-ada")
    rounds = ", ".join(f"{node.run_id} ({node.status}, {len(node.rows)} records)"
                       for node in tree.roots)
    echo(f"  runstream run history sub-ada --tree: rounds {rounds}")
    tree = run_tree(view, "order-A")
    kids = ", ".join(f"{c.run_id} ({c.flow}, {c.status})" for c in tree.roots[0].children)
    echo(f"  runstream run history order-A --tree: children {kids}")
    items = view.history("order-0002")
    diff = run_diff(view, "order-0002", Point("record", 3), Point("record", len(items)))
    echo(f"  runstream run diff order-0002 --from record:3 --to record:{len(items)}:")
    for line in format_diff(diff)[1:7]:
        echo("    " + line)
    await _fork(client, view, bootstrap=bootstrap, namespace=namespace, echo=echo)
    await _dry_runs(bootstrap=bootstrap, namespace=namespace,
                    read_model_dir=client.read_model_dir, echo=echo)
    await _system_then(client, view, echo)
    await _verify(bootstrap=bootstrap, namespace=namespace,
                  read_model_dir=client.read_model_dir, echo=echo)


async def _system_then(client: Client, view: View, echo: Echo) -> None:
    """Every run's status at the instant the 150th checkout was created."""
    instant = view.history("order-0150")[0].timestamp_ms
    state = await state_of_model(await client.read_model(), instant, limit=3)
    counts = ", ".join(f"{status.value} {n}" for status, n
                       in sorted(state.comparison.counts_then.items()))
    echo(f"  runstream state --at {iso(instant)}: {counts}; "
         f"{state.comparison.changed_total} runs have moved on since "
         f"(replayed {state.records_replayed} records from {state.start.describe()}, "
         f"{state.seconds:.2f}s)")


async def _verify(*, bootstrap: str, namespace: str, read_model_dir: Path,
                  echo: Echo) -> None:
    report = await verify(bootstrap=bootstrap, namespace=namespace,
                          read_model_dir=read_model_dir, shards=1)
    outcome = "every hash and key matches" if report.ok else "DIVERGES"
    echo(f"  runstream projection verify: rebuilt {report.records} records from offset 0, "
         f"{report.checkpoints_checked} checkpoint(s) checked: {outcome}")


async def _fork(client: Client, view: View, *, bootstrap: str, namespace: str,
                echo: Echo) -> None:
    rows = view.history("order-0001")
    reserved = next(n for n, item in enumerate(rows, start=1) if item.type == "step.completed")
    made = await fork_run(bootstrap=bootstrap, namespace=namespace, run_id="order-0001",
                          at_record=reserved, new_run_id="order-0001-again", force=False,
                          read_model_dir=client.read_model_dir)
    echo(f"  runstream run fork order-0001 --at record:{reserved} --as order-0001-again: "
         f"{made.entries} journal entry copied (the reservation)")
    result = await client.get_handle(made.run_id).result(timeout=60)
    entries = await client.journal(made.run_id)
    charge_id = result["charge_id"] if isinstance(result, dict) else result.charge_id
    echo(f"    -> {charge_id}: reserve replayed from the copy "
         f"({entries[0].result_json}), charge and receipt ran live")


async def _dry_runs(*, bootstrap: str, namespace: str, read_model_dir: Path,
                    echo: Echo) -> None:
    for app in ("runstream.engine.demo.flows:flows", "runstream.engine.demo.next_deploy:flows"):
        report = await dry_run(bootstrap=bootstrap, namespace=namespace, run_id="order-0003",
                               app=app, read_model_dir=read_model_dir)
        echo(f"  runstream run fork order-0003 --dry-run --app {app}:")
        for line in format_dry_run(report)[:2]:
            echo("    " + line)
