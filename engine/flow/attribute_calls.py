"""`ctx.set_attributes` and `ctx.attributes`: what a run is about, set by its handler.

A change is journaled like a journaled value (`step.completed` of kind `attributes`, its
JSON as the result), so a replay takes the same position and writes nothing; the reducer
merges it into the run's attributes (projections.attributes), which a read model indexes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from runstream.projections.attributes import (
    ATTRIBUTES_KIND,
    as_dict,
    encode_changes,
    merged,
    replayed,
)
from runstream.projections.state import Attribute


class AttributeCalls:
    """Mixed into FlowContext, which journals values (`_journaled_value`)."""

    # The round's first attributes (projections.attributes.round_start) with the changes
    # this execution made or replayed so far.
    _attributes_now: tuple[Attribute, ...]

    def _journaled_value(self, kind: str, make: Callable[[], str]) -> Awaitable[str]:
        raise NotImplementedError

    @property
    def attributes(self) -> dict[str, Any]:
        """The run's attributes as this execution last set them (times as UTC datetimes)."""
        return as_dict(self._attributes_now)

    async def set_attributes(self, values: Mapping[str, Any]) -> None:
        """Set the run's attributes (str, int, float, bool, aware datetime, list of str;
        None removes one), journaled: queries find the run by them once the journal has
        the change. InvalidAttributes, before anything is journaled, for a bad name or
        value, or past 64 attributes or 2 KiB in all."""
        changes = dict(values)
        text = encode_changes(changes)  # (checks each name and value)
        checked: list[tuple[Attribute, ...]] = []

        def change() -> str:  # a change not journaled yet: its bounds are checked
            checked.append(merged(self._attributes_now, changes, -1))
            return text

        journaled = await self._journaled_value(ATTRIBUTES_KIND, change)
        # (a replay: the change the journal holds, from where the round began)
        self._attributes_now = checked[0] if checked else replayed(self._attributes_now,
                                                                   journaled)
