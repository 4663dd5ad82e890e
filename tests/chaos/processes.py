"""The processes a chaos session drives: worker processes and a dedicated one-node broker.

The broker is the harness's own (engine.broker.BrokerCluster on free ports below the
ephemeral range, its own data dir, a small heap), never the shared one: the harness stops
and starts it as a fault.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from runstream.engine.broker import BrokerCluster, BrokerError
from tests.chaos.flows import LEDGER_ENV
from tests.integration.support import stop_process
from tests.integration.test_cluster import _free_base_port

APP = "tests.chaos.flows:flows"
BROKER_HEAP_MB = 384
START_ATTEMPTS = 3  # a restarted node that exits during startup is started again


def worker_log_level() -> str:
    """WARNING, unless $RUNSTREAM_CHAOS_LOG_LEVEL asks for more (INFO shows each claim,
    release and ownership confirmation: what a finding's timeline needs)."""
    return os.environ.get("RUNSTREAM_CHAOS_LOG_LEVEL") or "WARNING"


@dataclass
class ChaosWorker:
    """`runstream worker` in its own OS process. A slot is one data dir; each incarnation
    (a replacement after kill -9, a graceful restart) reuses it under a new name."""

    slot: int
    bootstrap: str
    namespace: str
    root: Path
    ledger: Path
    session_timeout_ms: int
    incarnation: int = 0
    paused: bool = False
    started_at: float = 0.0  # monotonic time of the latest start
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def data_dir(self) -> Path:
        return self.root / f"worker-{self.slot}"

    @property
    def name(self) -> str:
        return f"w{self.slot}.{self.incarnation}"

    @property
    def log_path(self) -> Path:
        return self.root / f"worker-{self.slot}.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> ChaosWorker:
        self.incarnation += 1
        self.paused = False
        self.started_at = time.monotonic()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, LEDGER_ENV: str(self.ledger)}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "runstream.engine.cli", "worker", "--app", APP,
                 "--data-dir", str(self.data_dir), "--bootstrap", self.bootstrap,
                 "--namespace", self.namespace, "--name", self.name,
                 "--session-timeout-ms", str(self.session_timeout_ms),
                 "--concurrency", "64", "--drain-timeout", "3",
                 "--log-level", worker_log_level()],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9: no goodbye, no flush; its data dir stays as the crash left it."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()
        self.paused = False

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        if self.alive():
            os.kill(self.pid, signal.SIGCONT)
        self.paused = False

    def stop(self, timeout: float = 30.0) -> int:
        """Graceful: SIGCONT (a paused process cannot handle SIGTERM), SIGTERM, wait; SIGKILL
        only if it does not exit in `timeout`. Returns the exit code."""
        self.paused = False
        return 0 if self.proc is None else stop_process(self.proc, timeout)


def dedicated_broker(data_dir: Path) -> BrokerCluster:
    """A one-node broker of the harness's own, provisioned, not started."""
    cluster = BrokerCluster(nodes=1, base_port=_free_base_port(1), data_dir=data_dir,
                            heap_mb=BROKER_HEAP_MB)
    cluster.provision()
    return cluster


def restart_broker(cluster: BrokerCluster) -> tuple[float, float]:
    """Stop the node (SIGTERM, as an operator would; SIGKILL if it takes over 15 s) and
    start it again: (seconds to stop, seconds to start and answer)."""
    started = time.monotonic()
    cluster.stop(timeout=15.0)
    stopped = time.monotonic()
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            cluster.start(timeout=90.0)
            break
        except BrokerError:
            # On a loaded machine the node sometimes exits during startup (the old JVM's
            # ports or locks not yet released): try again, then give up loudly.
            if attempt == START_ATTEMPTS:
                raise
            time.sleep(3.0)
    return stopped - started, time.monotonic() - stopped
