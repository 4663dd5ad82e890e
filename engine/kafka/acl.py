"""The least a worker or a client principal needs, as Kafka ACLs: `runstream acl grant`.

Roles (see ARCHITECTURE.md, Security: clients write only requests, workers relay them):

    worker  READ, WRITE, DESCRIBE, DESCRIBE_CONFIGS (it reads the journal's retention) on
            every `<ns>.` topic (prefixed: journal, owners,
            dead-letter, snapshots, requests, requests.<authority>), READ and DESCRIBE on
            the `<ns>.` consumer groups (the worker group and the relay group). Only
            workers write snapshots: each is derived from the journal they own.
    client  WRITE and DESCRIBE on `<ns>.requests` (or `<ns>.requests.<authority>` with an
            authority); READ and DESCRIBE on `<ns>.journal` (the client follows it for
            results), `<ns>.owners` and `<ns>.snapshots` (its read model, the one `run
            status` and `runs list` fold, bootstraps from them). Never WRITE on the journal
            or the snapshots: a client cannot make a decision, a claim included, that the
            reducer would apply, nor a snapshot a loader would.

Idempotent producers need no cluster-level IdempotentWrite ACL on Kafka 3.2 and later
(KIP-679: WRITE on a topic implies it); older brokers are not supported here. Topics are
created by an administrator (the broker's super user), so no role may CREATE.

The ACLs are created through the admin API (CreateAcls, which aiokafka encodes but does not
wrap), connected as the administrator: the RUNSTREAM_* settings of the calling process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from aiokafka.errors import for_code
from aiokafka.protocol.admin import CreateAclsRequest

from runstream.engine.config import (
    journal_topic,
    owners_topic,
    requests_topic,
    resolve_namespace,
    snapshot_topic,
)
from runstream.engine.errors import AccessDenied, InvalidInput
from runstream.engine.journal.input_limits import check_authority_name
from runstream.engine.kafka.admin import admin_client
from runstream.engine.kafka.connection import KafkaSecurity

Role = Literal["worker", "client"]
ROLES: tuple[Role, ...] = ("worker", "client")

# Kafka's wire codes (org.apache.kafka.common.resource / acl enums).
_TOPIC, _GROUP = 2, 3
_LITERAL, _PREFIXED = 3, 4
_OPERATIONS = {"READ": 3, "WRITE": 4, "DESCRIBE": 8, "DESCRIBE_CONFIGS": 10}
_ALLOW = 3
_ANY_HOST = "*"
_DENIED_CODES = (29, 31)  # TopicAuthorizationFailed, ClusterAuthorizationFailed


@dataclass(frozen=True)
class AclBinding:
    """One ALLOW rule: `principal` may do `operation` on the resource, from any host."""

    principal: str
    resource: Literal["topic", "group"]
    name: str
    pattern: Literal["literal", "prefixed"]
    operation: Literal["READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS"]

    def describe(self) -> str:
        star = "*" if self.pattern == "prefixed" else ""
        return f"{self.principal} {self.operation} {self.resource} {self.name}{star}"


def role_bindings(role: str, principal: str, namespace: str | None = None,
                  authority: str | None = None) -> list[AclBinding]:
    """The ACLs of `role` for `principal` in `namespace` (the role table above)."""
    if role not in ROLES:
        raise InvalidInput(f"role {role!r} is not one of {', '.join(ROLES)}")
    kind, _, name = principal.partition(":")
    if kind != "User" or not name:
        raise InvalidInput(f"principal {principal!r} must look like User:NAME")
    space = resolve_namespace(namespace)
    if authority is not None:  # (it names a topic: `topics create --requests` checks it too)
        check_authority_name(authority)
    if role == "worker":
        if authority is not None:
            raise InvalidInput("--authority applies to the client role only")
        prefix = f"{space}."
        return [
            *(AclBinding(principal, "topic", prefix, "prefixed", op)
              for op in ("READ", "WRITE", "DESCRIBE", "DESCRIBE_CONFIGS")),
            *(AclBinding(principal, "group", prefix, "prefixed", op)
              for op in ("READ", "DESCRIBE")),
        ]
    requests = requests_topic(space, authority)
    return [
        AclBinding(principal, "topic", requests, "literal", "WRITE"),
        AclBinding(principal, "topic", requests, "literal", "DESCRIBE"),
        *(AclBinding(principal, "topic", topic, "literal", op)
          for topic in (journal_topic(space), owners_topic(space), snapshot_topic(space))
          for op in ("READ", "DESCRIBE")),
    ]


async def create_acls(bootstrap: str, bindings: list[AclBinding],
                      security: KafkaSecurity | None = None,
                      request_timeout: float = 30.0) -> None:
    """Create every binding (an existing one is left as is: CreateAcls is idempotent)."""
    async with admin_client(bootstrap, request_timeout, security) as admin:
        for binding in bindings:
            request = CreateAclsRequest(
                _TOPIC if binding.resource == "topic" else _GROUP, binding.name,
                _PREFIXED if binding.pattern == "prefixed" else _LITERAL,
                binding.principal, _ANY_HOST, _OPERATIONS[binding.operation], _ALLOW)
            # Any broker forwards CreateAcls to the KRaft controller.
            response = await admin._send_request(request)
            for result in response.to_object()["creation_responses"]:
                _check(result["error_code"], result["error_message"], binding)


def _check(code: int, message: str | None, binding: AclBinding) -> None:
    if code == 0:
        return
    name = for_code(code).__name__
    if code in _DENIED_CODES:
        raise AccessDenied(f"not authorized to create ACLs ({name}): grant as the broker's "
                           "super user (RUNSTREAM_SASL_USERNAME=admin with `broker start "
                           "--security sasl_ssl`)")
    if code == 35:  # SecurityDisabled: no authorizer configured
        raise InvalidInput("the broker has no authorizer: start it with ACLs on "
                           "(`runstream broker start --security sasl_ssl --acl`)")
    raise InvalidInput(f"cannot grant {binding.describe()}: {name}: {message or ''}".rstrip(": "))


async def grant_role(*, bootstrap: str, role: str, principal: str,
                     namespace: str | None = None, authority: str | None = None,
                     security: KafkaSecurity | None = None) -> list[AclBinding]:
    """`runstream acl grant`: create the role's ACLs; return them. A worker's grants are
    prefixed by `<ns>.`, so another namespace whose topics start so (`<ns>.eu`, made before
    new namespaces' names could hold no "."; engine.kafka.admin.ensure_topics) would be
    inside them: refused."""
    bindings = role_bindings(role, principal, namespace, authority)
    if role == "worker":
        space = resolve_namespace(namespace)
        async with admin_client(bootstrap, 30.0, security) as admin:
            inside = sorted(t for t in await admin.list_topics() if foreign(space, t))
        if inside:
            raise InvalidInput(
                f"a worker's grants cover every topic named {space}.*, and "
                f"{', '.join(inside[:3])} belong{'s' if len(inside) == 1 else ''} to another "
                f"namespace: its workers' journal would be writable by {principal}")
    await create_acls(bootstrap, bindings, security)
    return bindings


def foreign(namespace: str, topic: str) -> bool:
    """Whether `topic` starts with `<namespace>.` without being one of its topics (the
    journal, owners, dead-letter, snapshots, requests, requests.<authority>)."""
    own = topic.removeprefix(f"{namespace}.")
    if own == topic:
        return False
    return not (own in ("journal", "owners", "dead-letter", "snapshots", "requests")
                or (own.startswith("requests.") and "." not in own[len("requests."):]))
