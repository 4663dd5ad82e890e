"""Where a local cluster lives: its nodes' ports and directories, and its remembered layout.

    <data dir>/cluster.json            nodes, ports and cluster id, so stop/status need no flags
    <data dir>/node-<id>/server.properties, log4j2.properties   rewritten on every start
    <data dir>/node-<id>/data/          Kafka's log.dirs (and the KRaft metadata log)
    <data dir>/node-<id>/kafka.log      the JVM's output; kafka.log.prev is the previous run's
    <data dir>/node-<id>/kafka.pid
    <data dir>/security/                CA, broker keystore, users (SASL_SSL clusters only)
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from runstream.engine.broker.toolchain import BrokerError, state_root

DEFAULT_HOST = "127.0.0.1"
SINGLE_NODE_CLIENT_PORT = 9092
SINGLE_NODE_CONTROLLER_PORT = 9093
CLUSTER_CLIENT_BASE_PORT = 19092
# Multi-node controllers listen at client port + 100 (19192…), leaving room for 100 nodes.
CLUSTER_CONTROLLER_OFFSET = 100
LAYOUT_FILE = "cluster.json"
FLUSH_MESSAGES = "log.flush.interval.messages"


@dataclass(frozen=True)
class NodeSpec:
    node_id: int
    host: str
    client_port: int
    controller_port: int
    directory: Path

    @property
    def address(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def config_path(self) -> Path:
        return self.directory / "server.properties"

    @property
    def log4j_path(self) -> Path:
        return self.directory / "log4j2.properties"

    @property
    def log_path(self) -> Path:
        return self.directory / "kafka.log"

    @property
    def pid_path(self) -> Path:
        return self.directory / "kafka.pid"

    @property
    def log_dirs(self) -> Path:
        return self.directory / "data"


@dataclass(frozen=True)
class Layout:
    nodes: int
    cluster_id: str
    client_ports: list[int]
    controller_ports: list[int]
    security: str = "plaintext"  # or "sasl_ssl": see engine/broker/security.py
    acl: bool = False


def default_data_dir(nodes: int = 1) -> Path:
    """~/.local/state/runstream/broker for one node; a separate dir per multi-node size."""
    return state_root() / ("broker" if nodes == 1 else f"broker-{nodes}nodes")


def new_cluster_id() -> str:
    """A Kafka-style id: a random UUID in URL-safe base64 without padding, as StorageTool makes.

    Kafka rejects ids starting with '-' (they would parse as a command-line option).
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not text.startswith("-"):
            return text


def compute_ports(
    nodes: int, base_port: int | None, controller_base_port: int | None, stored: Layout | None
) -> tuple[list[int], list[int]]:
    """(client ports, controller ports): explicit ports win, then the ports the data dir
    last used (so `stop` and `status` need no flags), then the defaults."""
    if base_port is None and controller_base_port is None and stored is not None:
        return stored.client_ports, stored.controller_ports
    if base_port is None:
        base_port = SINGLE_NODE_CLIENT_PORT if nodes == 1 else CLUSTER_CLIENT_BASE_PORT
    if controller_base_port is None:
        controller_base_port = base_port + (1 if nodes == 1 else CLUSTER_CONTROLLER_OFFSET)
    clients = [base_port + i for i in range(nodes)]
    controllers = [controller_base_port + i for i in range(nodes)]
    every = clients + controllers
    if len(set(every)) != len(every) or not all(0 < p < 65536 for p in every):
        raise BrokerError(
            f"client ports {clients} and controller ports {controllers} overlap or are invalid"
        )
    return clients, controllers


def load_layout(data_dir: Path) -> Layout | None:
    path = data_dir / LAYOUT_FILE
    try:
        raw = json.loads(path.read_text("utf-8"))
        return Layout(
            nodes=int(raw["nodes"]),
            cluster_id=str(raw["cluster_id"]),
            client_ports=[int(p) for p in raw["client_ports"]],
            controller_ports=[int(p) for p in raw["controller_ports"]],
            security=str(raw.get("security", "plaintext")),
            acl=bool(raw.get("acl", False)),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BrokerError(f"unreadable {path}: {exc}") from exc


def save_layout(data_dir: Path, layout: Layout) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = data_dir / f".{LAYOUT_FILE}.tmp"
    tmp.write_text(json.dumps(asdict(layout), indent=2) + "\n", "utf-8")
    tmp.replace(data_dir / LAYOUT_FILE)


def flush_settings(every_write: bool) -> dict[str, int]:
    """server.properties entries for the flush policy: fsync after every write, or (empty)
    Kafka's default, which leaves flushing to the OS and relies on replication."""
    return {FLUSH_MESSAGES: 1} if every_write else {}


def read_property(path: Path, key: str) -> str | None:
    try:
        lines = path.read_text("utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        name, sep, value = line.partition("=")
        if sep and name.strip() == key:
            return value.strip()
    return None
