"""The JVM processes of local Kafka nodes: launching, recognising and stopping them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from runstream.engine.broker.layout import NodeSpec
from runstream.engine.broker.toolchain import BrokerError

# Processes started by this Python process. Polling their Popen reaps them, so a broker
# that died is not mistaken for a live zombie by a long-lived parent (a pytest session).
_children: dict[int, subprocess.Popen[bytes]] = {}


def check_ports_free(spec: NodeSpec) -> None:
    for port in (spec.client_port, spec.controller_port):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # Same option the JVM sets: a port left in TIME_WAIT by a stopped broker is free.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((spec.host, port))
            except OSError as exc:
                raise BrokerError(
                    f"port {spec.host}:{port} for node {spec.node_id} is taken by another "
                    f"process ({exc.strerror}); stop it or choose other ports (--port)"
                ) from exc


def launch(java: str, libs: Path, spec: NodeSpec, heap_mb: int) -> int:
    if spec.log_path.exists():
        spec.log_path.replace(spec.log_path.with_name("kafka.log.prev"))
    command = [
        java, f"-Xmx{heap_mb}m", f"-Xms{max(64, heap_mb // 2)}m",
        "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:+ExitOnOutOfMemoryError",
        "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={spec.log4j_path}",
        "-cp", f"{libs}{os.sep}*", "kafka.Kafka", str(spec.config_path),
    ]
    with open(spec.log_path, "wb") as log:
        # A new session: Ctrl-C in the terminal that ran `broker start` must not reach it.
        proc = subprocess.Popen(command, cwd=spec.directory, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    _children[proc.pid] = proc
    spec.pid_path.write_text(f"{proc.pid}\n", "utf-8")
    return proc.pid


def is_node_process(pid: int, config_path: Path) -> bool:
    child = _children.get(pid)
    if child is not None:
        if child.poll() is None:
            return True
        del _children[pid]
        return False
    proc = Path("/proc") / str(pid)
    if Path("/proc/self").exists():
        # Linux: the pid must be alive, not a zombie, and be the JVM of this node's config;
        # a pid file can outlive its process and the pid be reused by anything else.
        try:
            state = (proc / "stat").read_text("utf-8").rpartition(")")[2].split()[0]
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):
            return False
        return state != "Z" and str(config_path).encode() in argv
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def send_signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def wait_gone(
    victims: dict[int, tuple[NodeSpec, int]], deadline: float
) -> dict[int, tuple[NodeSpec, int]]:
    alive = dict(victims)
    while alive:
        for node_id, (spec, pid) in list(alive.items()):
            if not is_node_process(pid, spec.config_path):
                del alive[node_id]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return alive
