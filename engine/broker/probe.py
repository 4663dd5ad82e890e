"""Is a Kafka broker answering? One raw Metadata request over a blocking socket.

Readiness is decided by the broker's own answer, never by a log line. The launcher, the CLI
and the test fixtures are synchronous and may run while an asyncio loop exists in the same
thread, so this deliberately avoids asyncio and aiokafka.
"""

from __future__ import annotations

import socket
import ssl
import struct
from dataclasses import dataclass

from runstream.engine.config import host_port

_METADATA_API_KEY = 3
# v4 is non-flexible (simple framing), understood by Kafka 1.0 … 4.x and by Redpanda, and
# returns the broker list, the cluster id and the controller id, which is all we need.
_METADATA_VERSION = 4
_CLIENT_ID = b"runstream-probe"
_SASL_HANDSHAKE_API_KEY = 17
_SASL_AUTHENTICATE_API_KEY = 36


class ProbeError(Exception):
    """The address did not answer a Metadata request like a Kafka broker."""


@dataclass(frozen=True)
class ProbeAuth:
    """How to reach a SASL_SSL listener: trust `cafile`, log in with SASL PLAIN."""

    cafile: str
    username: str
    password: str


@dataclass(frozen=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int


@dataclass(frozen=True)
class ClusterMetadata:
    brokers: tuple[BrokerInfo, ...]
    cluster_id: str | None
    controller_id: int

    @property
    def broker_ids(self) -> frozenset[int]:
        return frozenset(b.node_id for b in self.brokers)


def parse_bootstrap(bootstrap: str) -> list[tuple[str, int]]:
    """`host:port[,host:port…]` → [(host, port)]; a bare host means port 9092."""
    addresses: list[tuple[str, int]] = []
    for item in bootstrap.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            addresses.append(host_port(item))
        except ValueError:
            raise ValueError(f"bad bootstrap address {item!r}: expected host:port") from None
    if not addresses:
        raise ValueError(f"empty bootstrap address {bootstrap!r}")
    return addresses


def fetch_metadata(host: str, port: int, timeout: float = 2.0,
                   auth: ProbeAuth | None = None) -> ClusterMetadata:
    """Send Metadata v4 for no topics and decode the broker list; raise ProbeError if not Kafka.

    With `auth`, the connection is TLS (verified against `auth.cafile`) and logs in with SASL
    PLAIN first, as a SASL_SSL listener requires.
    """
    # Empty (not null) topic array = "no topics"; allow_auto_topic_creation = false.
    body = struct.pack(">ib", 0, 0)
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            raw.settimeout(timeout)
            sock = raw
            if auth is not None:
                context = ssl.create_default_context(cafile=auth.cafile)
                sock = context.wrap_socket(raw, server_hostname=host)
                _sasl_plain(sock, auth, f"{host}:{port}")
            payload = _exchange(sock, _METADATA_API_KEY, _METADATA_VERSION, 1, body)
    except (OSError, ssl.SSLError) as exc:
        raise ProbeError(f"{host}:{port}: {exc}") from exc
    return _decode_metadata(payload, 1, f"{host}:{port}")


def _exchange(sock: socket.socket, api_key: int, version: int, correlation_id: int,
              body: bytes) -> bytes:
    """One request with a v1 (non-flexible) header; the response frame after its size."""
    header = struct.pack(">hhih", api_key, version, correlation_id,
                         len(_CLIENT_ID)) + _CLIENT_ID
    request = header + body
    sock.sendall(struct.pack(">i", len(request)) + request)
    (size,) = struct.unpack(">i", _recv_exact(sock, 4))
    if size < 4 or size > 16 * 1024 * 1024:
        raise ProbeError(f"answered with a frame of {size} bytes")
    return _recv_exact(sock, size)


def _sasl_plain(sock: socket.socket, auth: ProbeAuth, where: str) -> None:
    """SaslHandshake v1 (PLAIN), then SaslAuthenticate v0 with `\\0user\\0password`."""
    mechanism = b"PLAIN"
    reply = _Reader(_exchange(sock, _SASL_HANDSHAKE_API_KEY, 1, 2,
                              struct.pack(">h", len(mechanism)) + mechanism))
    reply.int32()  # correlation id
    if (code := reply.int16()) != 0:
        raise ProbeError(f"{where} refused SASL PLAIN (error {code})")
    token = b"\0" + auth.username.encode() + b"\0" + auth.password.encode()
    reply = _Reader(_exchange(sock, _SASL_AUTHENTICATE_API_KEY, 0, 3,
                              struct.pack(">i", len(token)) + token))
    reply.int32()
    if (code := reply.int16()) != 0:
        raise ProbeError(f"{where}: SASL authentication failed: {reply.nullable_string()}")


def probe(bootstrap: str, timeout: float = 2.0,
          auth: ProbeAuth | None = None) -> ClusterMetadata:
    """Metadata from the first address of `bootstrap` that answers."""
    errors: list[str] = []
    for host, port in parse_bootstrap(bootstrap):
        try:
            return fetch_metadata(host, port, timeout, auth)
        except ProbeError as exc:
            errors.append(str(exc))
    raise ProbeError("; ".join(errors))


def is_answering(bootstrap: str, timeout: float = 2.0) -> bool:
    """True when some address of `bootstrap` answers Metadata with at least one live broker."""
    try:
        return bool(probe(bootstrap, timeout).brokers)
    except (ProbeError, ValueError):
        return False


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks: list[bytes] = []
    remaining = size
    while remaining:
        chunk = sock.recv(min(remaining, 65536))
        if not chunk:
            raise ProbeError("connection closed before a full response arrived")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self._data = data
        self._pos = 0

    def int16(self) -> int:
        return self._unpack(">h", 2)

    def int32(self) -> int:
        return self._unpack(">i", 4)

    def nullable_string(self) -> str | None:
        length = self.int16()
        if length < 0:
            return None
        raw = self._take(length)
        return raw.decode("utf-8")

    def string(self) -> str:
        value = self.nullable_string()
        if value is None:
            raise ProbeError("null where a string was expected")
        return value

    def _unpack(self, fmt: str, size: int) -> int:
        (value,) = struct.unpack(fmt, self._take(size))
        return int(value)

    def _take(self, size: int) -> bytes:
        if self._pos + size > len(self._data):
            raise ProbeError("truncated Metadata response")
        raw = self._data[self._pos : self._pos + size]
        self._pos += size
        return raw


def _decode_metadata(payload: bytes, correlation_id: int, where: str) -> ClusterMetadata:
    reader = _Reader(payload)
    if reader.int32() != correlation_id:
        raise ProbeError(f"{where} answered with a foreign correlation id")
    reader.int32()  # throttle_time_ms
    brokers = []
    for _ in range(reader.int32()):
        node_id = reader.int32()
        host = reader.string()
        port = reader.int32()
        reader.nullable_string()  # rack
        brokers.append(BrokerInfo(node_id, host, port))
    cluster_id = reader.nullable_string()
    controller_id = reader.int32()
    # The topic array follows; we asked for none and do not need it.
    return ClusterMetadata(tuple(brokers), cluster_id, controller_id)
