"""`run resume`'s resolution of a quarantine, its options checked together (the CLI's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runstream.engine.cli.options import json_option
from runstream.engine.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class Resolution:
    """An operator's resolution of a quarantine, as `run resume` takes it."""

    resolution: str  # retry | skip
    position: int
    digest: str
    result: Any = None  # skip: the step's outcome


def parse_resolution(resolution: str | None, position: int | None, digest: str | None,
                     result_json: str | None) -> Resolution | None:
    """`run resume`'s resolution options checked together: None for a plain wake (no
    option given); InvalidInput for a missing, extra or malformed one."""
    if resolution is None:
        given = [name for name, value in (("--position", position), ("--digest", digest),
                                          ("--result", result_json)) if value is not None]
        if given:
            raise InvalidInput(f"{', '.join(given)} only go with --resolution retry|skip "
                               f"(resolving a quarantine)")
        return None
    if resolution not in ("retry", "skip"):
        raise InvalidInput(f"--resolution must be retry or skip, not {resolution!r}")
    missing = [name for name, value in (("--position", position), ("--digest", digest))
               if value is None]
    if missing:
        raise InvalidInput(f"--resolution {resolution} needs {' and '.join(missing)}: the "
                           f"quarantined step's (`runstream run status ID` shows them)")
    assert position is not None and digest is not None
    if resolution == "retry":
        if result_json is not None:
            raise InvalidInput("--result goes with --resolution skip only: retry runs the "
                               "step again")
        return Resolution("retry", position, digest)
    if result_json is None:
        raise InvalidInput("--resolution skip needs --result: the step's outcome as JSON, "
                           "recorded as if the step had returned it")
    return Resolution("skip", position, digest, json_option(result_json, "--result"))
