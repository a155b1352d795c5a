"""Settings shared by every Kafka client the product opens (kafka-python, aiokafka, librdkafka): protocol and security.

Production clusters want TLS and SASL. The ``[kafka]`` table of the pipeline config names the
security protocol, the SASL mechanism and user, and the TLS files; the password never sits in
the config: it comes from ``FAIRSTREAM_KAFKA_SASL_PASSWORD`` or from the file
``sasl_password_file`` names (a mounted secret). Every ``FAIRSTREAM_KAFKA_<KEY>`` environment
variable overrides the config's ``<key>``. A process resolves the settings once
(:func:`use`, called by the CLI after it reads the config) and every client it then creates (worker
consumers and producer, the control follower and client, the topic admin, replay, re-fit sources
and service, the webhook's publisher) passes :func:`aiokafka_options`, :func:`kafka_python_options`
or (confluent-kafka's clients, whose settings are one dict) :func:`librdkafka_options` on. Without a
config, the environment alone decides (PLAINTEXT by default).

The password is never logged: :class:`ClientSecurity`'s repr masks it, and errors name the key, not
the value.

>>> security = ClientSecurity.resolve(env={"FAIRSTREAM_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
...                                        "FAIRSTREAM_KAFKA_SASL_USERNAME": "fs", "FAIRSTREAM_KAFKA_SASL_PASSWORD": "s3"})
>>> security
ClientSecurity(protocol='SASL_PLAINTEXT', mechanism='PLAIN', username='fs', password='***')
>>> sorted(security.kafka_python_options())
['sasl_mechanism', 'sasl_plain_password', 'sasl_plain_username', 'security_protocol']
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

KAFKA_API_VERSION = (2, 5)
"""kafka-python's protocol version: what the embedded broker (Tansu) answers correctly with consumer
groups (auto-detection picks one it mis-answers); Apache Kafka accepts it too. kafka-python 3 names it
(2, 5): (2, 5, 0) is the same version with a warning on every client."""

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
ENV_PREFIX = "FAIRSTREAM_KAFKA_"
KEYS = ("security_protocol", "sasl_mechanism", "sasl_username", "sasl_password_file", "ssl_cafile", "ssl_certfile",
        "ssl_keyfile")
"""The ``[kafka]`` keys, each overridable by ``FAIRSTREAM_KAFKA_<KEY>``."""
LIBRDKAFKA_TLS_KEYS = {"cafile": "ssl.ca.location", "certfile": "ssl.certificate.location",
                       "keyfile": "ssl.key.location"}


class KafkaSecurityError(ValueError):
    """Inconsistent Kafka security settings; the message names the key (never a secret)."""


@dataclass(frozen=True)
class ClientSecurity:
    """How clients authenticate and encrypt: protocol, SASL mechanism and credentials, TLS files."""

    protocol: str = "PLAINTEXT"
    mechanism: str = "PLAIN"
    username: str = ""
    password: str = field(default="", repr=False)
    cafile: str = ""
    certfile: str = ""
    keyfile: str = ""

    def __repr__(self) -> str:
        shown = [f"protocol={self.protocol!r}"]
        if self.sasl:
            shown += [f"mechanism={self.mechanism!r}", f"username={self.username!r}", "password='***'"]
        shown += [f"{name}={getattr(self, name)!r}" for name in ("cafile", "certfile", "keyfile") if getattr(self, name)]
        return f"ClientSecurity({', '.join(shown)})"

    @property
    def sasl(self) -> bool:
        """Whether clients authenticate with SASL."""
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        """Whether connections are encrypted."""
        return self.protocol.endswith("SSL")

    @classmethod
    def resolve(cls, config=None, env: Mapping[str, str] | None = None) -> "ClientSecurity":
        """The settings of a ``[kafka]`` config table (any object with its keys, or None) under the environment."""
        env = os.environ if env is None else env
        values = {key: str(getattr(config, key, "") or "") for key in KEYS}
        values.update({key: env[ENV_PREFIX + key.upper()] for key in KEYS if env.get(ENV_PREFIX + key.upper())})
        password = env.get(ENV_PREFIX + "SASL_PASSWORD", "")
        if not password and values["sasl_password_file"]:
            password = _read_secret(values["sasl_password_file"])
        security = cls(protocol=values["security_protocol"] or "PLAINTEXT",
                       mechanism=values["sasl_mechanism"] or "PLAIN", username=values["sasl_username"],
                       password=password, cafile=values["ssl_cafile"], certfile=values["ssl_certfile"],
                       keyfile=values["ssl_keyfile"])
        security.check()
        return security

    def check(self) -> None:
        """Refuse settings a broker would reject late and obscurely; name the key to fix."""
        if self.protocol not in PROTOCOLS:
            raise KafkaSecurityError(f"kafka.security_protocol must be one of {list(PROTOCOLS)}, got {self.protocol!r}")
        if self.sasl and self.mechanism not in MECHANISMS:
            raise KafkaSecurityError(f"kafka.sasl_mechanism must be one of {list(MECHANISMS)}, got {self.mechanism!r}")
        if self.sasl and not (self.username and self.password):
            missing = "kafka.sasl_username" if not self.username else \
                f"the password ({ENV_PREFIX}SASL_PASSWORD or kafka.sasl_password_file)"
            raise KafkaSecurityError(f"security_protocol {self.protocol} needs {missing}")
        for name in ("cafile", "certfile", "keyfile"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise KafkaSecurityError(f"kafka.ssl_{name}: no such file {path!r}")
        if bool(self.certfile) != bool(self.keyfile):
            raise KafkaSecurityError("kafka.ssl_certfile and kafka.ssl_keyfile go together (a client certificate "
                                     "and its key)")

    def _protocol_options(self) -> dict:
        """The options both clients name alike: the protocol and SASL credentials."""
        options: dict = {"security_protocol": self.protocol} if self.protocol != "PLAINTEXT" else {}
        if self.sasl:
            options.update(sasl_mechanism=self.mechanism, sasl_plain_username=self.username,
                           sasl_plain_password=self.password)
        return options

    def kafka_python_options(self) -> dict:
        """Keyword arguments for kafka-python's KafkaProducer, KafkaConsumer and KafkaAdminClient."""
        options = self._protocol_options()
        if self.tls:
            options.update({f"ssl_{name}": getattr(self, name) for name in ("cafile", "certfile", "keyfile")
                            if getattr(self, name)})
        return options

    def aiokafka_options(self) -> dict:
        """Keyword arguments for aiokafka's producer, consumer and admin client (TLS as an SSL context)."""
        options = self._protocol_options()
        if self.tls:
            from aiokafka.helpers import create_ssl_context

            options["ssl_context"] = create_ssl_context(cafile=self.cafile or None, certfile=self.certfile or None,
                                                        keyfile=self.keyfile or None)
        return options

    def librdkafka_options(self) -> dict:
        """The same settings as librdkafka configuration properties (confluent-kafka's Consumer and Producer)."""
        options: dict = {"security.protocol": self.protocol} if self.protocol != "PLAINTEXT" else {}
        if self.sasl:
            options.update({"sasl.mechanism": self.mechanism, "sasl.username": self.username,
                            "sasl.password": self.password})
        if self.tls:
            options.update({key: getattr(self, name) for name, key in LIBRDKAFKA_TLS_KEYS.items()
                            if getattr(self, name)})
        return options


def _read_secret(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise KafkaSecurityError(f"kafka.sasl_password_file: cannot read {path!r} ({exc.strerror or exc})") from None


_active: ClientSecurity | None = None


def use(security: ClientSecurity) -> None:
    """Make ``security`` the settings of every client this process creates from now on."""
    global _active
    _active = security


def active() -> ClientSecurity:
    """The process's settings: those given to :func:`use`, else the environment's."""
    return _active if _active is not None else ClientSecurity.resolve()


def kafka_python_options() -> dict:
    """The active settings as kafka-python keyword arguments."""
    return active().kafka_python_options()


def aiokafka_options() -> dict:
    """The active settings as aiokafka keyword arguments."""
    return active().aiokafka_options()


def librdkafka_options() -> dict:
    """The active settings as librdkafka configuration properties."""
    return active().librdkafka_options()


def authorization_refusal(operation: str, resource: str, name: str, purpose: str = "", config: str | None = None,
                          security: ClientSecurity | None = None) -> str:
    """The one line the product says when the broker refuses it: who may not do what to which resource.

    The CLI's dispatcher and the worker's consumers both say it this way, so an operator reads the
    same sentence wherever Kafka's authorisation stopped the product, and learns where the ACLs are.

    Parameters
    ----------
    operation : str
        What was refused, as a verb: ``"read"``, ``"write"``, ``"describe"``, ``"create"``.
    resource : str
        ``"topic"``, ``"group"``, ``"transactional-id"`` or ``"cluster"``.
    name : str
        The resource's name.
    purpose : str, default=""
        What the refused operation was for, when that is another resource (a group read to read a topic).
    config : str or None, default=None
        The pipeline config the ACLs come from (None: ``PIPELINE``, a placeholder).
    security : ClientSecurity or None, default=None
        The settings the refused client used; None is the process's (:func:`active`).

    Returns
    -------
    str
        ``not authorised: User:NAME may not OPERATION RESOURCE NAME (...; see 'fairstream acls --config ...')``.

    >>> authorization_refusal("write", "topic", "fs.control", config="p.toml",
    ...                       security=ClientSecurity("SASL_SSL", "SCRAM-SHA-512", "x", "pw"))
    "not authorised: User:x may not write topic fs.control (Kafka refused it; see 'fairstream acls --config p.toml')"
    """
    security = active() if security is None else security
    if security.sasl:
        principal = f"User:{security.username}"
    elif security.certfile:
        principal = f"the principal of the client certificate {security.certfile}"
    else:
        principal = "User:ANONYMOUS"  # what Kafka calls a client that does not authenticate
    why = f"to {purpose}; " if purpose else ""
    return (f"not authorised: {principal} may not {operation} {resource} {name} ({why}Kafka refused it; see "
            f"'fairstream acls --config {config or 'PIPELINE'}')")
