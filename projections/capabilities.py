"""Capability sets: what a run may do, narrowed by its flow's ceiling and its parent's."""

from __future__ import annotations

from collections.abc import Iterable


def narrow(ceiling: Iterable[str] | None, capabilities: Iterable[str] | None
           ) -> tuple[str, ...] | None:
    """The intersection of two capability sets, None meaning unrestricted."""
    if ceiling is None and capabilities is None:
        return None
    if ceiling is None:
        return tuple(sorted(set(capabilities or ())))
    if capabilities is None:
        return tuple(sorted(set(ceiling)))
    return tuple(sorted(set(ceiling) & set(capabilities)))
