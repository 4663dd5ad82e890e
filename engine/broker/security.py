"""A local broker that authenticates (SASL) and encrypts (TLS): `broker start --security sasl_ssl`.

Everything lives in `<data dir>/security/` (mode 0700; secret files 0600):

    ca.pem (+ its key)      a CA made for this data dir (PEM: what clients trust)
    broker.p12              the brokers' key and certificate, SAN 127.0.0.1 and localhost,
                            signed by that CA, with the CA in its chain
    secrets.json            the keystore password and every user's password

The certificates are made with the `openssl` command when there is one (Debian installs it
with ca-certificates; it takes milliseconds), else with `keytool`, which ships with every
JDK (the broker needs one anyway; seven JVM starts, a few seconds each on a busy machine).
The `cryptography` package is not needed. Users exist
twice, with the same password: as SCRAM credentials written into the KRaft metadata by
Kafka's own StorageTool (`format --add-scram`), and as PLAIN users in the listener's JAAS
config (Kafka's PLAIN mechanism checks a static list, not the SCRAM store).

The client listener is SASL_SSL with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512; brokers talk to
each other over it as `admin` (SCRAM-SHA-512). The controller listener stays on loopback,
SASL_PLAINTEXT with PLAIN as `admin` (SCRAM cannot authenticate controllers: their
credentials live in the metadata the controllers serve). With ACLs on, KRaft's
StandardAuthorizer denies anything no ACL allows, and `admin` is the only super user.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from runstream.engine.broker.probe import ProbeAuth
from runstream.engine.broker.toolchain import BrokerError

PLAINTEXT = "plaintext"
SASL_SSL = "sasl_ssl"
MODES = (PLAINTEXT, SASL_SSL)
ADMIN = "admin"
DEFAULT_USERS = (ADMIN, "worker", "client")
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
CLIENT_LISTENER = "SASL_SSL"
_CERT_DAYS = 825  # the longest validity clients accept for a server certificate
_CA_DAYS = 3650
_KEYTOOL_TIMEOUT_S = 120.0
_PLAIN_MODULE = "org.apache.kafka.common.security.plain.PlainLoginModule"
_SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"


@dataclass(frozen=True)
class Secrets:
    keystore_password: str
    users: dict[str, str]  # name -> password; a handful of users, bounded by the operator


class BrokerSecurity:
    """The TLS material and users of one data dir's SASL_SSL cluster."""

    def __init__(self, data_dir: Path, *, acl: bool = False) -> None:
        self.directory = data_dir / "security"
        self.acl = acl

    @property
    def ca_path(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def keystore_path(self) -> Path:
        return self.directory / "broker.p12"

    @property
    def secrets_path(self) -> Path:
        return self.directory / "secrets.json"

    def secrets(self) -> Secrets:
        try:
            raw = json.loads(self.secrets_path.read_text("utf-8"))
            return Secrets(str(raw["keystore_password"]),
                           {str(k): str(v) for k, v in raw["users"].items()})
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise BrokerError(f"unreadable {self.secrets_path}: {exc}; remove "
                              f"{self.directory} and the data dir to start afresh") from exc

    def prepare(self, java: str, passwords: Mapping[str, str] | None = None) -> Secrets:
        """Make the CA, the broker keystore and the users' passwords unless they exist.

        `passwords` sets (or adds) users; the others get random passwords. Given passwords
        change the stored ones only for users whose SCRAM credentials are not written yet,
        i.e. before the first start.
        """
        self.directory.mkdir(parents=True, exist_ok=True)
        os.chmod(self.directory, 0o700)
        if self.secrets_path.exists():
            stored = self.secrets()
            users = {**stored.users, **{k: v for k, v in (passwords or {}).items()
                                         if k not in stored.users}}
            current = Secrets(stored.keystore_password, users)
        else:
            users = {name: secrets.token_urlsafe(18) for name in DEFAULT_USERS}
            current = Secrets(secrets.token_urlsafe(18), {**users, **(passwords or {})})
        for name, password in current.users.items():
            _check_credential(name, password)
        self._write_secrets(current)
        if not (self.keystore_path.exists() and self.ca_path.exists()):
            openssl = shutil.which("openssl")
            if openssl:
                _openssl_certificates(openssl, self.directory, current.keystore_password)
            else:
                _make_certificates(_keytool(java), self.directory, current.keystore_password)
        return current

    def _write_secrets(self, value: Secrets) -> None:
        tmp = self.secrets_path.with_name(".secrets.json.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({"keystore_password": value.keystore_password, "users": value.users},
                      out, indent=2)
        tmp.replace(self.secrets_path)

    def format_arguments(self) -> list[str]:
        """StorageTool `format` arguments that create every user's SCRAM credentials."""
        arguments: list[str] = []
        for name, password in self.secrets().users.items():
            for mechanism in SCRAM_MECHANISMS:
                arguments += ["--add-scram", f"{mechanism}=[name={name},password={password}]"]
        return arguments

    def server_settings(self, client_address: str, controller_address: str
                        ) -> dict[str, object]:
        """server.properties entries for the listeners, TLS, SASL and (maybe) ACLs."""
        found = self.secrets()
        admin_password = found.users[ADMIN]
        plain_users = " ".join(f'user_{n}="{p}"' for n, p in found.users.items())
        admin_login = f'username="{ADMIN}" password="{admin_password}"'
        settings: dict[str, object] = {
            "listeners": f"{CLIENT_LISTENER}://{client_address},"
                         f"CONTROLLER://{controller_address}",
            "advertised.listeners": f"{CLIENT_LISTENER}://{client_address}",
            "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT",
            "inter.broker.listener.name": CLIENT_LISTENER,
            "sasl.enabled.mechanisms": "PLAIN," + ",".join(SCRAM_MECHANISMS),
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config":
                f'{_PLAIN_MODULE} required {admin_login} user_{ADMIN}="{admin_password}";',
            "listener.name.sasl_ssl.plain.sasl.jaas.config":
                f"{_PLAIN_MODULE} required {admin_login} {plain_users};",
            **{f"listener.name.sasl_ssl.{m.lower()}.sasl.jaas.config":
               f"{_SCRAM_MODULE} required {admin_login};" for m in SCRAM_MECHANISMS},
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": self.keystore_path,
            "ssl.keystore.password": found.keystore_password,
            "ssl.key.password": found.keystore_password,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": self.ca_path,
        }
        if self.acl:
            settings.update({
                "authorizer.class.name":
                    "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                "super.users": f"User:{ADMIN}",
                "allow.everyone.if.no.acl.found": "false",
            })
        return settings

    def probe_auth(self) -> ProbeAuth:
        return ProbeAuth(cafile=str(self.ca_path), username=ADMIN,
                         password=self.secrets().users[ADMIN])

    def client_env(self, user: str) -> dict[str, str]:
        """The RUNSTREAM_* settings with which `user` connects to this cluster."""
        users = self.secrets().users
        if user not in users:
            raise BrokerError(f"no user {user!r} in {self.secrets_path}: "
                              f"users are {', '.join(sorted(users))}")
        return {
            "RUNSTREAM_SECURITY_PROTOCOL": "SASL_SSL",
            "RUNSTREAM_SASL_MECHANISM": "SCRAM-SHA-512",
            "RUNSTREAM_SASL_USERNAME": user,
            "RUNSTREAM_SASL_PASSWORD": users[user],
            "RUNSTREAM_SSL_CAFILE": str(self.ca_path),
        }


def _check_credential(name: str, password: str) -> None:
    # The names and passwords go into a JAAS config and StorageTool's `[name=…,password=…]`
    # syntax, neither of which can quote; refuse what they would misread.
    for label, value in (("user name", name), ("password", password)):
        if not value or any(c in value for c in '"\\,=[]; \t\r\n'):
            raise BrokerError(f"{label} {value!r} is empty or has one of  \" \\ , = [ ] ; "
                              "or white space")


def _keytool(java: str) -> str:
    """The keytool of the JDK that runs the broker (next to its `java`), else PATH's."""
    beside = Path(os.path.realpath(java)).parent / "keytool"
    if os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("keytool")
    if not found:
        raise BrokerError(f"keytool not found next to {java} nor on PATH: install a full JDK")
    return found


def _make_certificates(keytool: str, directory: Path, password: str) -> None:
    """A CA, and a broker key pair whose certificate the CA signs (SAN 127.0.0.1, localhost)."""
    ca, broker = directory / "ca.p12", directory / "broker.p12"
    for stale in (ca, broker, directory / "ca.pem"):
        stale.unlink(missing_ok=True)  # keytool refuses to overwrite an alias
    csr, signed = directory / "broker.csr", directory / "broker.pem"
    store = ["-storetype", "PKCS12", "-storepass", password]
    san = "SAN=ip:127.0.0.1,dns:localhost"
    steps = [
        ["-genkeypair", "-alias", "ca", "-keyalg", "RSA", "-keysize", "2048",
         "-dname", "CN=runstream local CA", "-validity", str(_CA_DAYS),
         "-ext", "bc:c", "-ext", "ku:c=keyCertSign,cRLSign", "-keystore", str(ca), *store],
        ["-exportcert", "-rfc", "-alias", "ca", "-keystore", str(ca), "-file",
         str(directory / "ca.pem"), *store],
        ["-genkeypair", "-alias", "broker", "-keyalg", "RSA", "-keysize", "2048",
         "-dname", "CN=localhost", "-validity", str(_CERT_DAYS), "-ext", san,
         "-keystore", str(broker), *store],
        ["-certreq", "-alias", "broker", "-keystore", str(broker), "-file", str(csr), *store],
        ["-gencert", "-rfc", "-alias", "ca", "-keystore", str(ca), "-infile", str(csr),
         "-outfile", str(signed), "-validity", str(_CERT_DAYS), "-ext", san,
         "-ext", "ku:c=digitalSignature,keyEncipherment", "-ext", "eku=serverAuth,clientAuth",
         *store],
        ["-importcert", "-noprompt", "-alias", "ca", "-file", str(directory / "ca.pem"),
         "-keystore", str(broker), *store],
        ["-importcert", "-noprompt", "-alias", "broker", "-file", str(signed),
         "-keystore", str(broker), *store],
    ]
    for arguments in steps:
        _run_keytool(keytool, arguments)
    csr.unlink(missing_ok=True)
    for path in (ca, broker):
        os.chmod(path, 0o600)


def _openssl_certificates(openssl: str, directory: Path, password: str) -> None:
    """The same CA and broker keystore as `_make_certificates`, made by openssl."""
    ca_key, ca_pem = directory / "ca.key", directory / "ca.pem"
    key, csr, signed = directory / "broker.key", directory / "broker.csr", directory / "broker.pem"
    extensions = directory / "broker.ext"
    extensions.write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
        "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n", "utf-8")
    old_umask = os.umask(0o077)  # the keys are created 0600
    try:
        steps = [
            ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key),
             "-out", str(ca_pem), "-days", str(_CA_DAYS), "-subj", "/CN=runstream local CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
            ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
             "-subj", "/CN=localhost"],
            ["x509", "-req", "-in", str(csr), "-CA", str(ca_pem), "-CAkey", str(ca_key),
             "-CAcreateserial", "-out", str(signed), "-days", str(_CERT_DAYS),
             "-extfile", str(extensions)],
            ["pkcs12", "-export", "-name", "broker", "-in", str(signed), "-inkey", str(key),
             "-certfile", str(ca_pem), "-out", str(directory / "broker.p12"),
             "-passout", f"pass:{password}"],
        ]
        for arguments in steps:
            _run_tool(openssl, arguments)
    finally:
        os.umask(old_umask)
    os.chmod(ca_pem, 0o644)  # public: what clients trust
    for leftover in (csr, key, extensions, directory / "ca.srl"):
        leftover.unlink(missing_ok=True)


def _run_keytool(keytool: str, arguments: list[str]) -> None:
    _run_tool(keytool, arguments)


def _run_tool(tool: str, arguments: list[str]) -> None:
    name = f"{Path(tool).name} {arguments[0]}"
    try:
        done = subprocess.run([tool, *arguments], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=_KEYTOOL_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BrokerError(f"{name} failed: {exc}") from exc
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()
        raise BrokerError(f"{name} failed (exit {done.returncode}): "
                          f"{output.splitlines()[-1] if output else 'no output'}",
                          detail=output)
