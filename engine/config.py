"""Where to find the broker and which namespace to use: keyword > flag > environment > default."""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_NAMESPACE = "runstream"
DEFAULT_PARTITIONS = 12


def resolve_bootstrap(explicit: str | None = None) -> str:
    return explicit or os.environ.get("RUNSTREAM_BOOTSTRAP") or DEFAULT_BOOTSTRAP


def resolve_namespace(explicit: str | None = None) -> str:
    return explicit or os.environ.get("RUNSTREAM_NAMESPACE") or DEFAULT_NAMESPACE


def cache_root() -> Path:
    """RUNSTREAM_CACHE_DIR, else $XDG_CACHE_HOME/runstream, else ~/.cache/runstream: the root
    of the Kafka jars and the read models."""
    explicit = os.environ.get("RUNSTREAM_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "runstream"


def journal_topic(namespace: str) -> str:
    return f"{namespace}.journal"


def owners_topic(namespace: str) -> str:
    return f"{namespace}.owners"


def dead_letter_topic(namespace: str) -> str:
    return f"{namespace}.dead-letter"


def worker_group(namespace: str) -> str:
    return f"{namespace}.workers"


def requests_topic(namespace: str, authority: str | None = None) -> str:
    """Where clients send requests when the namespace relays them (see ARCHITECTURE.md,
    Security): `<ns>.requests` for unrestricted principals, `<ns>.requests.<authority>` for a
    principal whose runs are limited to that authority's capabilities."""
    return f"{namespace}.requests" if authority is None else f"{namespace}.requests.{authority}"


def relay_group(namespace: str) -> str:
    return f"{namespace}.relay"
