"""Kafka's own authorisation for one pipeline: which principal may read and write which topic and group.

On a cluster with an authorizer (``allow.everyone.if.no.acl.found=false``) every part of a pipeline
runs as its own principal, and Kafka itself refuses what that principal's ACLs do not allow. The
roles (:data:`ROLES`) and what each needs:

* ``worker`` (``fairstream worker``): reads the inputs and the control topic, writes the outputs,
  the dead letters, the stats topic and the control topic (its announcements, re-embed events),
  reads its consumer groups ``<app id>.records`` and ``<app id>.embeddings``; under exactly-once
  its transactional ids (prefixes ``<app id>.records.`` and ``<app id>.embeddings.``).
* ``monitor`` (``fairstream monitor``): reads the stats topic in its group ``<app id>.monitor``, reads
  and writes the control topic (shadow-policy decisions), writes re-fit requests.
* ``refit`` (``fairstream refit``): reads re-fit requests in its groups ``<prefix>.refit.<kind>``,
  the research topic (its source) and the control topic, writes the control topic (its publishes)
  and re-fit requests (the Alertmanager webhook it serves).
* ``approver`` (people: ``fairstream artifacts publish|approve|reject|rollback|list|history``):
  reads and writes the control topic, nothing else (``artifacts report`` then cannot sample the
  input, and says so on its page).
* ``webhook``: writes re-fit requests (a webhook deployed apart from the re-fit service).

Every process that starts with the pipeline's topic check (worker, monitor, re-fit) also needs
Describe on every topic of the pipeline and DescribeConfigs on the control and stats topics (it
checks their compaction and retention); Read and Write imply Describe, so those are only listed for
the topics a role neither reads nor writes. No role gets ``All``, a wildcard name, Create, Delete,
Alter or a cluster right: creating the topics is the admin's (``fairstream acls --apply`` does it).
Idempotent producers need no IdempotentWrite: Kafka allows them with Write on any topic.

Principals default to ``User:<app id>-<role>``; ``--principal worker=User:alice`` names another.
``fairstream acls --config PIPELINE`` prints one ``kafka-acls.sh`` line per principal and resource
for an operator; ``--apply`` creates the topics and the ACLs itself, as the admin.

>>> from fairstream.streams.config import adult_config
>>> acls = pipeline_acls(adult_config())
>>> print(acls[0].command("127.0.0.1:9093"))  # doctest: +NORMALIZE_WHITESPACE
kafka-acls.sh --bootstrap-server 127.0.0.1:9093 --command-config admin.properties --add
    --allow-principal User:fairstream-adult-worker --operation Read --topic fairstream.records.in
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Mapping

if TYPE_CHECKING:
    from fairstream.streams.config import PipelineConfig

ROLES = ("worker", "monitor", "refit", "approver", "webhook")
"""The principals of a pipeline, in the order they are printed."""

ROLE_NOTES = {
    "worker": "workers: read the inputs and control, write outputs, dead letters, stats and control (announcements)",
    "monitor": "the monitoring agent: read stats, read and write control (shadow decisions), write re-fit requests",
    "refit": "the re-fit service: read re-fit requests and research, read and write control (publishes), "
             "write re-fit requests (its webhook)",
    "approver": "people (fairstream artifacts publish, approve, reject, rollback, list, history): read and write "
                "control",
    "webhook": "the Alertmanager webhook on its own: write re-fit requests",
}
OPERATIONS = ("Read", "Write", "Describe", "DescribeConfigs")
"""The only operations any role is given."""
RESOURCES = ("topic", "group", "transactional-id")
COMMAND_CONFIG = "admin.properties"


class AclError(ValueError):
    """A principal option that names no role or no principal."""


@dataclass(frozen=True)
class Acl:
    """Allow ``principal`` (in ``role``) ``operations`` on one resource, by its literal name or a name prefix.

    Parameters
    ----------
    role : str
        One of :data:`ROLES`.
    principal : str
        ``User:<name>``.
    resource : str
        ``"topic"``, ``"group"`` or ``"transactional-id"``.
    name : str
        The resource's name, or the prefix of its names when ``prefixed``.
    operations : tuple of str
        Some of :data:`OPERATIONS`.
    prefixed : bool, default=False
        Whether ``name`` is a prefix (``--resource-pattern-type prefixed``).
    """

    role: str
    principal: str
    resource: str
    name: str
    operations: tuple[str, ...]
    prefixed: bool = False

    def command(self, bootstrap: str = "BOOTSTRAP", command_config: str | None = COMMAND_CONFIG) -> str:
        """The ``kafka-acls.sh`` line that adds this ACL.

        Parameters
        ----------
        bootstrap : str, default="BOOTSTRAP"
            ``host:port`` of the cluster.
        command_config : str or None, default="admin.properties"
            The admin client's properties file (its security settings and credentials); None leaves it out.

        Returns
        -------
        str
            One shell line.
        """
        config = f" --command-config {command_config}" if command_config else ""
        operations = "".join(f" --operation {operation}" for operation in self.operations)
        pattern = " --resource-pattern-type prefixed" if self.prefixed else ""
        return (f"kafka-acls.sh --bootstrap-server {bootstrap}{config} --add --allow-principal {self.principal}"
                f"{operations} --{self.resource} {self.name}{pattern}")

    def bindings(self) -> list:
        """The ACL as confluent-kafka ``AclBinding``s (one per operation), for the admin API.

        Returns
        -------
        list of confluent_kafka.admin.AclBinding
            Allow bindings for any host.
        """
        from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

        kind = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP,
                "transactional-id": ResourceType.TRANSACTIONAL_ID}[self.resource]
        pattern = ResourcePatternType.PREFIXED if self.prefixed else ResourcePatternType.LITERAL
        operation = {"Read": AclOperation.READ, "Write": AclOperation.WRITE, "Describe": AclOperation.DESCRIBE,
                     "DescribeConfigs": AclOperation.DESCRIBE_CONFIGS}
        return [AclBinding(kind, self.name, pattern, self.principal, "*", operation[op], AclPermissionType.ALLOW)
                for op in self.operations]


def default_principals(app_id: str) -> dict[str, str]:
    """``{role: "User:<app id>-<role>"}`` for every role.

    Parameters
    ----------
    app_id : str
        The pipeline's app id.

    Returns
    -------
    dict of str to str
        The principal of each role.
    """
    return {role: f"User:{app_id}-{role}" for role in ROLES}


def parse_principals(options: Iterable[str]) -> dict[str, str]:
    """``ROLE=User:NAME`` options as ``{role: principal}``; :class:`AclError` names a bad one.

    Parameters
    ----------
    options : iterable of str
        Each ``ROLE=PRINCIPAL``, the principal ``User:<name>`` (a bare name gets ``User:``).

    Returns
    -------
    dict of str to str
        The overrides.
    """
    chosen: dict[str, str] = {}
    for option in options:
        role, _, principal = option.partition("=")
        role, principal = role.strip(), principal.strip()
        if role not in ROLES:
            raise AclError(f"--principal {option!r}: the role must be one of {', '.join(ROLES)}")
        if not principal or principal.endswith(":") or "*" in principal or any(c.isspace() for c in principal):
            raise AclError(f"--principal {option!r}: expected {role}=User:NAME (no wildcard, no spaces)")
        chosen[role] = principal if ":" in principal else f"User:{principal}"
    return chosen


def pipeline_acls(config: "PipelineConfig", app_id: str | None = None,
                  principals: Mapping[str, str] | None = None, roles: Iterable[str] = ROLES) -> list[Acl]:
    """Every ACL the pipeline's principals need, role by role (see the module docstring).

    Parameters
    ----------
    config : PipelineConfig
        The pipeline: its topics, its delivery guarantee.
    app_id : str or None, default=None
        The workers' app id; None is the config's (``PipelineConfig.app_id``).
    principals : mapping of str to str or None, default=None
        Principals by role, overriding :func:`default_principals`.
    roles : iterable of str, default=ROLES
        The roles to give ACLs to.

    Returns
    -------
    list of Acl
        In :data:`ROLES` order, then by resource.
    """
    app_id = app_id or config.app_id
    who = {**default_principals(app_id), **(principals or {})}
    t = config.topics
    every = [spec.name for spec in t.specs()]
    checked = {t.control, t.stats}  # topics whose configs the topic check reads
    reads = {"worker": [t.records_in, t.embeddings_in, t.control], "monitor": [t.stats, t.control],
             "refit": [t.refit_requests, t.research, t.control], "approver": [t.control], "webhook": []}
    writes = {"worker": [t.records_repaired, t.embeddings_repaired, t.dlq, t.stats, t.control],
              "monitor": [t.control, t.refit_requests], "refit": [t.control, t.refit_requests],
              "approver": [t.control], "webhook": [t.refit_requests]}
    checks_topics = {"worker", "monitor", "refit"}  # they start with the pipeline's topic check
    groups = {"worker": [(f"{app_id}.records", False), (f"{app_id}.embeddings", False)],
              "monitor": [(f"{app_id}.monitor", False)], "refit": [(f"{t.prefix}.refit.", True)]}
    chosen = list(roles)
    unknown = [role for role in chosen if role not in ROLES]
    if unknown:
        raise AclError(f"unknown role(s) {', '.join(unknown)}; the roles are {', '.join(ROLES)}")
    acls: list[Acl] = []
    for role in (role for role in ROLES if role in chosen):
        principal = who[role]
        for topic in every:
            operations = [op for op, wanted in (
                ("Read", topic in reads[role]), ("Write", topic in writes[role]),
                ("Describe", role in checks_topics and topic not in reads[role] + writes[role]),
                ("DescribeConfigs", role in checks_topics and topic in checked)) if wanted]
            if operations:
                acls.append(Acl(role, principal, "topic", topic, tuple(operations)))
        acls += [Acl(role, principal, "group", name, ("Read",), prefixed) for name, prefixed in groups.get(role, [])]
        if role == "worker" and config.delivery.guarantee == "exactly_once":
            acls += [Acl(role, principal, "transactional-id", f"{app_id}.{agent}.", ("Write", "Describe"), True)
                     for agent in ("records", "embeddings")]
    return acls


def render_acls(acls: list[Acl], bootstrap: str = "BOOTSTRAP", command_config: str | None = COMMAND_CONFIG,
                source: str = "") -> str:
    """The ``kafka-acls.sh`` lines for ``acls``, a comment line before each role's.

    Parameters
    ----------
    acls : list of Acl
        From :func:`pipeline_acls`.
    bootstrap : str, default="BOOTSTRAP"
        ``host:port`` of the cluster.
    command_config : str or None, default="admin.properties"
        The admin client's properties file the lines pass (None: none).
    source : str, default=""
        Where the ACLs come from (the config), named in the first comment.

    Returns
    -------
    str
        A shell script's text, ending in a newline.
    """
    lines = [f"# Kafka ACLs of {source or 'the pipeline'}: run as a super user"
             + (f" ({command_config} holds the admin client's security settings)" if command_config else "")]
    role = None
    for acl in acls:
        if acl.role != role:
            role = acl.role
            lines.append(f"# {role} {acl.principal}: {ROLE_NOTES[role]}")
        lines.append(acl.command(bootstrap, command_config))
    return "\n".join(lines) + "\n"


def apply_acls(admin, acls: list[Acl], timeout: float = 30.0) -> list[Acl]:
    """Create ``acls`` through the admin API (creating an ACL that exists changes nothing).

    Parameters
    ----------
    admin : confluent_kafka.admin.AdminClient
        A client of a principal allowed to alter ACLs (a super user).
    acls : list of Acl
        From :func:`pipeline_acls`.
    timeout : float, default=30.0
        Seconds to wait for the broker.

    Returns
    -------
    list of Acl
        ``acls``, once every binding is created (a refusal raises the client's ``KafkaException``).
    """
    bindings = [binding for acl in acls for binding in acl.bindings()]
    for future in admin.create_acls(bindings, request_timeout=timeout).values():
        future.result(timeout)
    return acls
