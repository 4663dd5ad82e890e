"""The machine under the figures: CPU time of each process, the broker's pid and flush policy."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from bench.report import CpuLine
from runstream.engine.broker.layout import FLUSH_MESSAGES as FLUSH_KEY
from runstream.engine.broker.layout import read_property
from runstream.engine.kafka.connection import kafka_options

_KAFKA_MAIN = b"kafka.Kafka"
_TICK_MS = 1000.0 / os.sysconf("SC_CLK_TCK")


def cpu_ms(pid: int) -> float | None:
    """utime + stime of a live process in milliseconds (from /proc/<pid>/stat), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text("ascii").rpartition(")")[2].split()
    except OSError:
        return None
    # fields[0] is field 3 (state); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) * _TICK_MS


@dataclass
class CpuMeter:
    """CPU time of named processes between `start()` and `stop()`.

    Read `stop()` before a process exits (or is killed): its /proc entry goes with it.
    """

    pids: dict[str, int | None]
    extra: dict[str, float | None] = field(default_factory=dict)  # measured by the caller
    _before: dict[str, float | None] = field(default_factory=dict)

    def start(self) -> None:
        self._before = {name: _read(pid) for name, pid in self.pids.items()}

    def stop(self) -> dict[str, float | None]:
        used: dict[str, float | None] = {}
        for name, pid in self.pids.items():
            before, after = self._before.get(name), _read(pid)
            used[name] = None if before is None or after is None else after - before
        return {**used, **self.extra}


def _read(pid: int | None) -> float | None:
    return None if pid is None else cpu_ms(pid)


@contextmanager
def measure_cpu(
    label: str, pids: Mapping[str, int | None], lines: list[CpuLine], units: int,
    per: str = "run",
) -> Iterator[CpuMeter]:
    """Appends a CpuLine for the block; `units` may be updated through the yielded meter."""
    meter = CpuMeter(dict(pids))
    meter.start()
    yield meter
    lines.append(CpuLine(label, per, units, meter.stop()))


def broker_pid(bootstrap: str) -> int | None:
    """The local Kafka JVM listening on the bootstrap's first port, found by scanning /proc."""
    port = bootstrap.split(",")[0].rpartition(":")[2]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if _KAFKA_MAIN not in argv or argv.index(_KAFKA_MAIN) + 1 >= len(argv):
            continue
        config = Path(argv[argv.index(_KAFKA_MAIN) + 1].decode(errors="replace"))
        listeners = read_property(config, "listeners") or ""
        if port in {address.rpartition(":")[2] for address in listeners.split(",")}:
            return int(entry.name)
    return None


def bench_pids(bootstrap: str) -> dict[str, int | None]:
    return {"broker": broker_pid(bootstrap), "bench": os.getpid()}


async def flush_policy(bootstrap: str, pid: int | None) -> dict[str, Any]:
    """Whether the broker fsyncs every write: from the broker (describe_configs), else from
    the server.properties of the local broker's command line."""
    value, source = await _flush_from_broker(bootstrap)
    if value is None and pid is not None:
        value, source = _flush_from_properties(pid), "server.properties"
    if value is None:
        mode = "unknown"
    elif value.strip() == "1":
        mode = "every write (log.flush.interval.messages=1)"
    elif value.strip() == str(2**63 - 1):
        mode = "Kafka default (no fsync per write; page cache, replication)"
    else:
        mode = f"every {value} messages"
    return {"flush": mode, FLUSH_KEY: value, "source": source}


async def _flush_from_broker(bootstrap: str) -> tuple[str | None, str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="runstream-bench",
                                **kafka_options())
    try:
        await admin.start()
        brokers = (await admin.describe_cluster())["brokers"]
        broker_id = str(brokers[0]["node_id"])
        resource = ConfigResource(ConfigResourceType.BROKER, broker_id, {FLUSH_KEY: None})
        for response in await admin.describe_configs([resource]):
            for res in response.to_object()["resources"]:
                for entry in res["config_entries"]:
                    if entry["config_names"] == FLUSH_KEY:
                        return entry["config_value"], f"describe_configs broker {broker_id}"
    except (KafkaError, OSError, KeyError, IndexError) as exc:
        return None, f"describe_configs failed: {exc!r}"
    finally:
        await admin.close()
    return None, "describe_configs: key not reported"


def _flush_from_properties(pid: int) -> str | None:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        config = Path(argv[argv.index(_KAFKA_MAIN) + 1].decode())
    except (OSError, ValueError, IndexError):
        return None
    return read_property(config, FLUSH_KEY) or str(2**63 - 1)
