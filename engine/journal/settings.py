"""Whole numbers read from RUNSTREAM_* variables: one parser and one error for all of them.

A bad value ends the command or the worker with one line naming the variable, the value and
what it counts (`SettingInvalid`, an InvalidInput the CLI prints as such), never a
traceback and never a silent default or clamp: a typo in a bound is a setting the operator
meant, and running with another would hide it.
"""

from __future__ import annotations

import os

from runstream.engine.errors import SettingInvalid as SettingInvalid  # re-exported


def env_count(name: str, default: int, *, unit: str, minimum: int = 0,
              maximum: int | None = None, zero: str | None = None) -> int:
    """The whole number in variable `name` (unset or blank: `default`) counting `unit`, in
    [minimum, maximum]; `zero` says what 0 means, for the message."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    meaning = f" (0: {zero})" if zero else ""
    try:
        value = int(raw)
    except ValueError:
        raise SettingInvalid(f"{name}={raw!r} is not a whole number of {unit}{meaning}"
                             ) from None
    if value < minimum or (maximum is not None and value > maximum):
        bounds = (f"{minimum} or more" if maximum is None
                  else f"between {minimum} and {maximum}")
        raise SettingInvalid(f"{name}={value} must be {bounds} {unit}{meaning}")
    return value
