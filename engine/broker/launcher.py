"""Run Apache Kafka (KRaft, combined broker+controller nodes) on loopback for development and CI.

Each node is a detached JVM with its own directory under the cluster's data dir (see
engine/broker/layout.py). Data survives stop/start. A node is "ready" when it answers a
Metadata request listing every running node of its cluster, never when a log line appears.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from runstream.engine.broker.layout import (
    DEFAULT_HOST,
    FLUSH_MESSAGES,
    Layout,
    NodeSpec,
    compute_ports,
    default_data_dir,
    flush_settings,
    load_layout,
    new_cluster_id,
    read_property,
    save_layout,
)
from runstream.engine.broker.probe import ProbeAuth, ProbeError, fetch_metadata
from runstream.engine.broker.process import (
    check_ports_free,
    is_node_process,
    launch,
    send_signal,
    wait_gone,
)
from runstream.engine.broker.security import MODES, PLAINTEXT, SASL_SSL, BrokerSecurity
from runstream.engine.broker.toolchain import (
    BrokerError,
    Progress,
    find_java,
    libs_dir,
    package_file,
    provision,
    tail_file,
)

MAX_NODES = 9
_LOG_TAIL_LINES = 40


@dataclass(frozen=True)
class NodeStatus:
    node_id: int
    address: str
    controller_port: int
    pid: int | None
    running: bool
    answering: bool
    log_path: Path


class BrokerCluster:
    """One or more local Kafka nodes sharing a data dir; see the module docstring."""

    def __init__(
        self,
        nodes: int = 1,
        base_port: int | None = None,
        data_dir: Path | str | None = None,
        cache_dir: Path | str | None = None,
        *,
        controller_base_port: int | None = None,
        host: str = DEFAULT_HOST,
        heap_mb: int | None = None,
        progress: Progress | None = None,
        flush_every_write: bool = False,
        security: str | None = None,
        acl: bool | None = None,
        passwords: Mapping[str, str] | None = None,
    ) -> None:
        if not 1 <= nodes <= MAX_NODES:
            raise BrokerError(f"nodes must be between 1 and {MAX_NODES}, not {nodes}")
        self.data_dir = Path(data_dir).expanduser() if data_dir else default_data_dir(nodes)
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir else None
        self.heap_mb = heap_mb or (512 if nodes == 1 else 384)
        self.flush_every_write = flush_every_write
        self._say = progress or (lambda _msg: None)
        stored = load_layout(self.data_dir)
        if stored and stored.nodes != nodes:
            raise BrokerError(
                f"{self.data_dir} holds a {stored.nodes}-node cluster, not {nodes}: "
                f"pass --nodes {stored.nodes} or use another data dir"
            )
        clients, controllers = compute_ports(nodes, base_port, controller_base_port, stored)
        self.cluster_id = stored.cluster_id if stored else self._existing_cluster_id(nodes)
        self.nodes = tuple(
            NodeSpec(i + 1, host, clients[i], controllers[i], self.data_dir / f"node-{i + 1}")
            for i in range(nodes)
        )
        self.security_mode = self._security_mode(security, stored)
        self.acl = acl if acl is not None else bool(stored and stored.acl)
        if self.acl and self.security_mode != SASL_SSL:
            raise BrokerError("ACLs need authenticated principals: add --security sasl_ssl")
        self._passwords = dict(passwords or {})
        self.security = (BrokerSecurity(self.data_dir, acl=self.acl)
                         if self.security_mode == SASL_SSL else None)

    # ---- public API -------------------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        return ",".join(node.address for node in self.nodes)

    @property
    def libs_dir(self) -> Path:
        return libs_dir(self.cache_dir)

    def client_env(self, user: str = "admin") -> dict[str, str]:
        """The RUNSTREAM_* variables with which `user` connects (empty when plaintext)."""
        return self.security.client_env(user) if self.security else {}

    def node(self, node_id: int) -> NodeSpec:
        for spec in self.nodes:
            if spec.node_id == node_id:
                return spec
        raise BrokerError(f"no node {node_id}: this cluster has nodes 1..{len(self.nodes)}")

    def provision(self) -> Path:
        """Fetch the Kafka jars into the cache unless already complete; return the libs dir."""
        return provision(self.cache_dir, self._say)

    def start(self, node: int | None = None, timeout: float | None = None) -> str:
        """Start the node (default: every node) unless running; wait until ready.

        Returns the bootstrap address. Nodes launched by this call are stopped again if the
        cluster does not become ready, so a failed start leaves nothing behind.
        """
        targets = self._select(node)
        libs = self.provision()
        java = find_java()
        to_launch = [spec for spec in targets if self._pid(spec) is None]
        self._warn_flush_unchanged([spec for spec in targets if spec not in to_launch])
        try:
            save_layout(self.data_dir, self._layout())
            if self.security is not None:
                self.security.prepare(java, self._passwords)
            for spec in to_launch:
                check_ports_free(spec)
                self._write_config(spec)
        except OSError as exc:
            raise BrokerError(f"cannot prepare {self.data_dir}: {exc}") from exc
        self._format(java, libs, to_launch)
        try:
            for spec in to_launch:
                pid = launch(java, libs, spec, self.heap_mb)
                self._say(f"started node {spec.node_id} (pid {pid}) on {spec.address}, "
                          f"log {spec.log_path}")
            self._wait_ready(targets, timeout or (60.0 if len(self.nodes) == 1 else 120.0))
        except BaseException:
            self._terminate(to_launch, grace=10.0)
            raise
        return self.bootstrap

    def stop(self, node: int | None = None, timeout: float = 30.0) -> list[int]:
        """SIGTERM the node (default: all at once), SIGKILL after `timeout`; return ids stopped.

        All nodes are signalled together: stopped one by one, the last ones would wait for a
        controller quorum that is already gone before shutting down.
        """
        return self._terminate(self._select(node), grace=timeout)

    def status(self) -> list[NodeStatus]:
        return [self._status(spec) for spec in self.nodes]

    def is_ready(self) -> bool:
        return all(s.answering for s in self.status())

    def __enter__(self) -> BrokerCluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ---- configuration ----------------------------------------------------------------------

    def _select(self, node: int | None) -> list[NodeSpec]:
        return list(self.nodes) if node is None else [self.node(node)]

    def _layout(self) -> Layout:
        return Layout(
            nodes=len(self.nodes),
            cluster_id=self.cluster_id,
            client_ports=[n.client_port for n in self.nodes],
            controller_ports=[n.controller_port for n in self.nodes],
            security=self.security_mode,
            acl=self.acl,
        )

    def _security_mode(self, asked: str | None, stored: Layout | None) -> str:
        """The asked mode, else the remembered one; a formatted cluster keeps its mode (its
        SCRAM users are written when it is formatted)."""
        remembered = stored.security if stored else None
        mode = (asked or remembered or PLAINTEXT).lower()
        if mode not in MODES:
            raise BrokerError(f"security {mode!r} is not one of {', '.join(MODES)}")
        formatted = any((spec.log_dirs / "meta.properties").exists() for spec in self.nodes)
        if formatted and mode != (remembered or PLAINTEXT):
            raise BrokerError(f"{self.data_dir} holds a {remembered or PLAINTEXT} cluster; "
                              f"use another --data-dir for a {mode} one")
        return mode

    def _existing_cluster_id(self, nodes: int) -> str:
        # cluster.json may be gone while formatted data remains: reuse that data's id. A new
        # id would split a partly formatted cluster, and StorageTool rejects (even with
        # --ignore-formatted) an id other than the one already on disk.
        for i in range(nodes):
            meta = self.data_dir / f"node-{i + 1}" / "data" / "meta.properties"
            found = read_property(meta, "cluster.id")
            if found:
                return found
        return new_cluster_id()

    def _server_properties(self, spec: NodeSpec) -> str:
        # Internal topics are replicated as widely as the cluster allows (3 at most), and
        # need a majority of those replicas in sync: RF 3 / min ISR 2 on three nodes.
        rf = min(3, len(self.nodes))
        min_isr = 1 if rf < 3 else 2
        voters = ",".join(f"{n.node_id}@{n.host}:{n.controller_port}" for n in self.nodes)
        settings = {
            "process.roles": "broker,controller",
            "node.id": spec.node_id,
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{spec.address},CONTROLLER://{spec.host}:"
            f"{spec.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{spec.address}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": spec.log_dirs,
            "num.partitions": 1,
            "default.replication.factor": rf,
            "min.insync.replicas": min_isr,
            "offsets.topic.replication.factor": rf,
            # The defaults (50 partitions each) make the first group/transaction slow.
            "offsets.topic.num.partitions": 3,
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": min_isr,
            "transaction.state.log.num.partitions": 3,
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": min_isr,
            "group.initial.rebalance.delay.ms": 0,
            # A topic auto-created by a stray producer would get 7-day retention: the journal
            # must be created with `runstream topics create` (infinite retention) instead.
            "auto.create.topics.enable": "false",
            **flush_settings(self.flush_every_write),
        }
        if self.security is not None:
            settings.update(self.security.server_settings(
                spec.address, f"{spec.host}:{spec.controller_port}"))
        header = "# Written by runstream on every `broker start`; edits are overwritten.\n"
        return header + "".join(f"{key}={value}\n" for key, value in settings.items())

    def _warn_flush_unchanged(self, running: list[NodeSpec]) -> None:
        """A running node keeps the flush policy it was started with."""
        wanted = flush_settings(self.flush_every_write).get(FLUSH_MESSAGES)
        for spec in running:
            current = read_property(spec.config_path, FLUSH_MESSAGES)
            if current != (None if wanted is None else str(wanted)):
                self._say(f"node {spec.node_id} is already running with "
                          f"{FLUSH_MESSAGES}={current or 'default'}; stop it to change that")

    def _write_config(self, spec: NodeSpec) -> None:
        spec.log_dirs.mkdir(parents=True, exist_ok=True)
        # 0600: a SASL_SSL node's config holds the keystore and user passwords.
        fd = os.open(spec.config_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(self._server_properties(spec))
        os.chmod(spec.config_path, 0o600)  # a file written before keeps its old mode
        spec.log4j_path.write_text(package_file("log4j2.properties"), "utf-8")

    def _format(self, java: str, libs: Path, specs: Iterable[NodeSpec]) -> None:
        """Format each node's storage once (in parallel: each format is a JVM start)."""
        running: list[tuple[NodeSpec, subprocess.Popen[str]]] = []
        for spec in specs:
            if (spec.log_dirs / "meta.properties").exists():
                continue
            self._say(f"formatting storage of node {spec.node_id} in {spec.log_dirs}")
            command = [
                java, "-Xmx256m", "-Drunstream.log.level=WARN",
                f"-Dlog4j2.configurationFile={spec.log4j_path}",
                "-cp", f"{libs}{os.sep}*", "kafka.tools.StorageTool", "format",
                "-t", self.cluster_id, "-c", str(spec.config_path), "--ignore-formatted",
                *(self.security.format_arguments() if self.security else []),
            ]
            proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, text=True)
            running.append((spec, proc))
        failures: list[tuple[NodeSpec, int | str, str]] = []
        for spec, proc in running:
            try:
                output, _ = proc.communicate(timeout=180)
            except subprocess.TimeoutExpired:
                proc.kill()
                output, _ = proc.communicate()
                failures.append((spec, "timeout after 180s", output))
                continue
            if proc.returncode != 0:
                failures.append((spec, f"exit {proc.returncode}", output))
        if failures:
            spec, code, output = failures[0]
            lines = [line for line in output.splitlines() if line.strip()]
            raise BrokerError(
                f"formatting node {spec.node_id} failed ({code}): {_gist(lines)}",
                detail="\n".join(lines[-_LOG_TAIL_LINES:]),
            )

    # ---- processes --------------------------------------------------------------------------

    def _pid(self, spec: NodeSpec) -> int | None:
        """The pid in the node's pid file if that process is alive and is this node's JVM."""
        try:
            pid = int(spec.pid_path.read_text("utf-8").strip())
        except (OSError, ValueError):
            return None
        return pid if is_node_process(pid, spec.config_path) else None

    def _answers(self, spec: NodeSpec, timeout: float = 1.0) -> frozenset[int] | None:
        try:
            return fetch_metadata(spec.host, spec.client_port, timeout,
                                  self._probe_auth()).broker_ids
        except ProbeError:
            return None

    def _probe_auth(self) -> ProbeAuth | None:
        return self.security.probe_auth() if self.security else None

    def _status(self, spec: NodeSpec) -> NodeStatus:
        pid = self._pid(spec)
        ids = self._answers(spec) if pid is not None else None
        return NodeStatus(
            node_id=spec.node_id, address=spec.address, controller_port=spec.controller_port,
            pid=pid, running=pid is not None, answering=ids is not None and spec.node_id in ids,
            log_path=spec.log_path,
        )

    def _wait_ready(self, targets: list[NodeSpec], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = {spec.node_id: spec for spec in targets}
        while True:
            expected = {spec.node_id for spec in self.nodes if self._pid(spec) is not None}
            for spec in list(pending.values()):
                if self._pid(spec) is None:
                    raise BrokerError(
                        f"node {spec.node_id} exited during startup; "
                        f"last lines of {spec.log_path}:",
                        detail=tail_file(spec.log_path, _LOG_TAIL_LINES),
                    )
                ids = self._answers(spec)
                if ids is not None and expected <= ids:
                    del pending[spec.node_id]
            if not pending:
                return
            if time.monotonic() > deadline:
                spec = next(iter(pending.values()))
                raise BrokerError(
                    f"node {spec.node_id} did not become ready on {spec.address} within "
                    f"{timeout:.0f}s; last lines of {spec.log_path}:",
                    detail=tail_file(spec.log_path, _LOG_TAIL_LINES),
                )
            time.sleep(0.25)

    def _terminate(self, specs: Iterable[NodeSpec], grace: float) -> list[int]:
        victims: dict[int, tuple[NodeSpec, int]] = {}
        for spec in specs:
            pid = self._pid(spec)
            if pid is not None:
                victims[spec.node_id] = (spec, pid)
                send_signal(pid, signal.SIGTERM)
                self._say(f"stopping node {spec.node_id} (pid {pid})")
        alive = wait_gone(victims, time.monotonic() + grace)
        for spec, pid in alive.values():
            self._say(f"node {spec.node_id} ignored SIGTERM for {grace:.0f}s: SIGKILL")
            send_signal(pid, signal.SIGKILL)
        alive = wait_gone(alive, time.monotonic() + 10.0)
        if alive:
            ids = ", ".join(str(i) for i in alive)
            raise BrokerError(f"node(s) {ids} survived SIGKILL")
        for spec, _pid in victims.values():
            spec.pid_path.unlink(missing_ok=True)
        return sorted(victims)


def _gist(lines: list[str]) -> str:
    """The line of a JVM tool's output that says what went wrong (not a stack frame)."""
    for line in lines:
        if "Exception" in line or line.startswith(("Error", "ERROR")):
            return line.removeprefix('Exception in thread "main" ').strip()[:300]
    messages = [line for line in lines if not line.startswith((" ", "\t"))]
    return messages[-1][:300] if messages else "no output"
