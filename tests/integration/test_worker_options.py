"""A worker option the broker or the machine refuses is one clear line naming the option
(review): a session timeout outside the broker's range said "Kafka:
InvalidSessionTimeoutError: [Error 26] InvalidSessionTimeoutError"; a metrics port in use
said "OSError: [Errno 98] Address already in use"."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.integration.test_cli import cli


async def test_a_session_timeout_and_a_metrics_port_refused_say_which_option(
    bootstrap: str, namespace: str, journal: str, tmp_path: Path
) -> None:
    common = ("worker", "--app", "tests.ui.flows:flows")
    timed = await cli(*common, "--data-dir", str(tmp_path / "a"), "--session-timeout-ms",
                      "100", bootstrap=bootstrap, namespace=namespace)
    last = timed.err.strip().splitlines()[-1]
    assert timed.code == 2 and last.startswith("error: the broker refused the worker's "
                                               "session timeout (--session-timeout-ms)"), timed.err
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        served = await cli(*common, "--data-dir", str(tmp_path / "b"), "--metrics-port",
                           str(port), bootstrap=bootstrap, namespace=namespace)
    last = served.err.strip().splitlines()[-1]
    assert served.code == 2 and last == (f"error: cannot serve metrics on 127.0.0.1:{port} "
                                         f"(--metrics-port): Address already in use"), served.err
