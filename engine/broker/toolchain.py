"""Where the broker's files live, which Java and Maven to use, and fetching the Kafka jars.

The jars come from Maven Central through the `pom.xml` shipped next to this module (the
Kafka release tarball is not on a package registry; Maven Central is). They are fetched
once into a cache directory shared by every data dir and every checkout.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path

from runstream.engine.config import cache_root

KAFKA_VERSION = "4.1.0"
# Pinned so that the result does not depend on the Maven version's super-POM defaults.
_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
_MANIFEST = "runstream-manifest.txt"
_MAVEN_TIMEOUT_S = 900.0

Progress = Callable[[str], None]


class BrokerError(Exception):
    """The local broker could not be provisioned, started or stopped.

    `message` is one line saying what went wrong; `detail` holds supporting output (the tail
    of a log). `str()` joins both, so a test failure shows the log; the CLI prints them apart.
    """

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.message}\n{self.detail}" if self.detail else self.message


def state_root() -> Path:
    """RUNSTREAM_STATE_DIR, else $XDG_STATE_HOME/runstream, else ~/.local/state/runstream."""
    explicit = os.environ.get("RUNSTREAM_STATE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "runstream"


def libs_dir(cache_dir: Path | None = None) -> Path:
    return (cache_dir or cache_root()) / f"kafka-{KAFKA_VERSION}" / "libs"


def package_file(name: str) -> str:
    """Text of a file shipped in this package (pom.xml, log4j2.properties)."""
    package = __package__ or "runstream.engine.broker"
    return resources.files(package).joinpath(name).read_text("utf-8")


def find_java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if os.access(candidate, os.X_OK):
            return str(candidate)
        raise BrokerError(f"JAVA_HOME={java_home} has no bin/java; fix JAVA_HOME or unset it")
    found = shutil.which("java")
    if not found:
        raise BrokerError("java not found: install a JDK 17 or newer, or set JAVA_HOME")
    return found


def find_maven() -> str:
    found = shutil.which("mvn")
    if not found:
        raise BrokerError(
            "mvn not found on PATH: install Maven (needed once, to fetch the Kafka jars)"
        )
    return found


def libs_complete(libs: Path) -> bool:
    """True when every jar named in the manifest is present (the manifest is written last)."""
    manifest = libs / _MANIFEST
    try:
        names = manifest.read_text("utf-8").split()
    except OSError:
        return False
    required = {f"kafka_2.13-{KAFKA_VERSION}.jar", f"kafka-clients-{KAFKA_VERSION}.jar"}
    if not required.issubset(names):
        return False
    return all((libs / name).is_file() for name in names)


def provision(cache_dir: Path | None = None, progress: Progress | None = None) -> Path:
    """Make sure the Kafka jars are in the cache; return the libs directory.

    Atomic: Maven writes into a temporary directory next to the target, which is renamed into
    place only once complete, so an interrupted download never looks like a usable install.
    A file lock serialises concurrent provisioners (two CI jobs, two terminals).
    """
    target = libs_dir(cache_dir)
    if libs_complete(target):
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with _lock(target.parent / ".provision.lock"):
            if libs_complete(target):  # someone else finished while we waited
                return target
            mvn = find_maven()
            say = progress or (lambda _msg: None)
            say(f"fetching Apache Kafka {KAFKA_VERSION} jars with Maven into {target} (once)")
            for leftover in target.parent.glob(".libs-*"):  # from a killed provisioner
                shutil.rmtree(leftover, ignore_errors=True)
            with tempfile.TemporaryDirectory(prefix=".libs-", dir=target.parent) as tmp:
                staged = _download(mvn, Path(tmp))
                _replace_dir(staged, target)
    except OSError as exc:
        raise BrokerError(f"cannot provision the Kafka jars in {target.parent}: {exc}") from exc
    if not libs_complete(target):
        raise BrokerError(f"provisioning left an incomplete {target}; delete it and retry")
    return target


def _download(mvn: str, workdir: Path) -> Path:
    pom = workdir / "pom.xml"
    pom.write_text(package_file("pom.xml"), "utf-8")
    staged = workdir / "libs"
    command = [
        mvn, "-B", "-q", "-Dstyle.color=never", "-f", str(pom),
        f"-Dkafka.version={KAFKA_VERSION}",
        f"{_DEPENDENCY_PLUGIN}:copy-dependencies",
        "-DincludeScope=runtime", f"-DoutputDirectory={staged}",
    ]
    try:
        result = subprocess.run(
            command, cwd=workdir, capture_output=True, text=True, timeout=_MAVEN_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise BrokerError(f"Maven did not finish within {_MAVEN_TIMEOUT_S:.0f}s") from exc
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()
        raise BrokerError(
            f"Maven failed (exit {result.returncode}) fetching Kafka {KAFKA_VERSION} jars: "
            + _first_error_line(output),
            detail=_tail(output, 30),
        )
    jars = sorted(p.name for p in staged.glob("*.jar"))
    (staged / _MANIFEST).write_text("\n".join(jars) + "\n", "utf-8")
    if not libs_complete(staged):
        raise BrokerError(f"Maven finished but the Kafka {KAFKA_VERSION} jars are missing")
    return staged


def _replace_dir(staged: Path, target: Path) -> None:
    if target.exists():
        # An incomplete leftover (we checked under the lock): move it aside, then delete it.
        stale = target.with_name(f".stale-{os.getpid()}-{target.name}")
        target.rename(stale)
        shutil.rmtree(stale, ignore_errors=True)
    staged.rename(target)


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _first_error_line(output: str) -> str:
    for line in output.splitlines():
        if "ERROR" in line:
            return line.replace("[ERROR]", "").strip()[:300]
    lines = output.splitlines()
    return lines[-1][:300] if lines else "no output"


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.splitlines()[-lines:])


def tail_file(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a (possibly large) log file, or '' if unreadable."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            data = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return _tail(data, lines)
