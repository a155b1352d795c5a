"""The pipeline's trust file: which public keys may change what serves, and in which role.

A pipeline names its trust file in its config (``[pipeline] trust = "trust.toml"``); ``trust = "none"``
(the embedded default) reads unsigned records and says so once at start. The file is TOML, one table per
key, named as the key's owner signs (``fairstream keys generate NAME`` writes ``NAME.pub``)::

    [keys.alice]
    public_key = "q1Yb...="            # NAME.pub: base64 of the 32 raw bytes of an Ed25519 public key
    roles = ["approver"]

    [keys."refit@prod"]
    public_key = "Xh3l...="
    roles = ["publisher"]

    [keys.old-operator]
    public_key = "9fQa...="
    roles = ["operator"]
    until_offset = 1200                 # rotated out: its signature counts on control records below offset 1200

Roles (:data:`ROLES`) and what each may write (:data:`ROLE_OF`): ``publisher`` publishes versions and
candidates, ``approver`` approves or rejects a candidate, ``operator`` rolls back and publishes the
pipeline's config, ``policy`` (the shadow policy) promotes or retires a candidate, ``requester`` asks
the re-fit service for a re-fit. A key without the role of a record is refused for it, whatever the
record claims (its ``actor`` is free text: it says who, the signature proves which key).

Rotation and revocation: ``until_offset`` ends a key at a control-topic offset (offsets cannot be
claimed by a writer, unlike times): records it signed below keep verifying, later ones are refused.
Removing a key revokes it everywhere, its past records included (they show as refused in ``artifacts
history --verify``). Re-fit requests travel on another topic: a key with ``until_offset`` may no longer
request.

>>> from fairstream.streams.control.signing import generate_key, public_key_text, sign
>>> key = generate_key()
>>> trust = Trust.parse(f'[keys.alice]\\npublic_key = "{public_key_text(key)}"\\nroles = ["approver"]\\n', "t.toml")
>>> trust.signer_of(sign({"action": "approve"}, "alice", key), "approver")
'alice'
>>> trust.signer_of(sign({"action": "rollback"}, "alice", key), "operator")
Traceback (most recent call last):
...
fairstream.streams.control.trust.TrustError: signed by 'alice', whose roles are approver: a rollback needs the operator role
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from .signing import SIGNER, SignatureError, verify

NONE = "none"
"""``[pipeline] trust = "none"``: records are read unsigned (the embedded default)."""
ROLES = ("publisher", "approver", "operator", "policy", "requester")
ROLE_OF = MappingProxyType({"publish": "publisher", "approve": "approver", "reject": "approver",
                            "rollback": "operator", "configure": "operator", "promote": "policy", "retire": "policy",
                            "request": "requester"})
"""The role a record's action needs (``request``: a re-fit request)."""
_KEY_FIELDS = ("public_key", "roles", "until_offset")


class TrustError(ValueError):
    """A record whose signer this pipeline does not trust for it, or a trust file that cannot be read; one line.

    ``category`` says which: ``unsigned``, ``untrusted`` (an unknown or rotated key, or bytes the signature does not
    match) or ``role``; ``altered`` is true when a trusted key's signature does not match the bytes, ``unknown_key``
    when the key it names is not in the trust file (never was, or was revoked by removing it).
    """

    def __init__(self, message: str, category: str = "untrusted", altered: bool = False, unknown_key: bool = False):
        super().__init__(message)
        self.category, self.altered, self.unknown_key = category, altered, unknown_key


@dataclass(frozen=True)
class TrustedKey:
    """One key of the trust file: its name, public key (base64 of 32 raw bytes), roles and end offset."""

    name: str
    public_key: str
    roles: frozenset[str]
    until_offset: int | None = None


@dataclass(frozen=True)
class Trust:
    """The keys a pipeline trusts and their roles, or none (``source`` is ``"none"``: unsigned).

    Parameters
    ----------
    keys : mapping of str to TrustedKey
        The trusted keys by name.
    source : str
        Where they were read (a path), or ``"none"``.
    """

    keys: Mapping[str, TrustedKey] = field(default_factory=dict)
    source: str = NONE

    @property
    def signed(self) -> bool:
        """Whether records must be signed (a trust file is named)."""
        return self.source != NONE

    @classmethod
    def none(cls) -> "Trust":
        """No trust file: every record is read unsigned.

        Returns
        -------
        Trust
            The unsigned trust.
        """
        return cls()

    @classmethod
    def load(cls, path: str | Path) -> "Trust":
        """The trust file at ``path`` (``"none"``: :meth:`none`); :class:`TrustError` names what is wrong in it.

        Parameters
        ----------
        path : str or Path
            The trust file, or ``"none"``.

        Returns
        -------
        Trust
            Its keys and roles.
        """
        if str(path) == NONE:
            return cls.none()
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise TrustError(f"pipeline.trust: cannot read the trust file {str(path)!r}: {exc.strerror}") from None
        return cls.parse(text, str(path))

    @classmethod
    def parse(cls, text: str, source: str) -> "Trust":
        """The trust file's ``text`` (read from ``source``, named in errors).

        Parameters
        ----------
        text : str
            TOML: one ``[keys.NAME]`` table per key (see the module docstring).
        source : str
            Where the text comes from.

        Returns
        -------
        Trust
            Its keys and roles.
        """
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise TrustError(f"trust file {source}: not TOML: {exc}") from None
        unknown = sorted(set(data) - {"keys"})
        if unknown or not isinstance(data.get("keys"), dict) or not data["keys"]:
            raise TrustError(f"trust file {source}: expected [keys.NAME] tables and nothing else, got "
                             f"{unknown or 'no keys'}")
        keys = {name: _trusted_key(name, entry, source) for name, entry in data["keys"].items()}
        return cls(MappingProxyType(keys), source)

    def signer_of(self, data: dict, role: str, offset: int | None = None) -> str:
        """The name of the key that signed ``data``, if it is trusted, has ``role`` and (on the control topic, at
        ``offset``) was not yet rotated out; :class:`TrustError` says why not, in one line.

        Parameters
        ----------
        data : dict
            The record as read (its JSON object), signature included.
        role : str
            The role its action needs (:data:`ROLE_OF`).
        offset : int or None, default=None
            Its control-topic offset; None for a message of another topic (a re-fit request), which a key with
            ``until_offset`` may no longer sign.

        Returns
        -------
        str
            The signer's name.
        """
        try:
            signer = verify(data, {name: key.public_key for name, key in self.keys.items()})
        except SignatureError as exc:
            claimed = data.get(SIGNER)
            raise TrustError(str(exc), "unsigned" if claimed is None else "untrusted", altered=exc.altered,
                             unknown_key=isinstance(claimed, str) and claimed not in self.keys) from None
        key = self.keys[signer]
        if key.until_offset is not None and (offset is None or offset >= key.until_offset):
            where = "off the control topic" if offset is None else f"at offset {offset}"
            raise TrustError(f"signed by {signer!r}, a key rotated out at control offset {key.until_offset}: it "
                             f"signs nothing {where}")
        if role not in key.roles:
            action = "re-fit request" if role == ROLE_OF["request"] else str(data.get("action", "publish"))
            raise TrustError(f"signed by {signer!r}, whose roles are {', '.join(sorted(key.roles))}: "
                             f"{_article(action)} {action} needs the {role} role", "role")
        return signer

    def fingerprint(self) -> str:
        """sha256 of the trusted keys, roles and end offsets: the same for every reader that trusts the same keys.

        Returns
        -------
        str
            64 hex digits (``"none"`` without a trust file).
        """
        if not self.signed:
            return NONE
        rows = sorted((k.name, k.public_key, sorted(k.roles), k.until_offset) for k in self.keys.values())
        return hashlib.sha256(repr(rows).encode()).hexdigest()


def claimed_signer(data: dict | None) -> str | None:
    """Who a record says signed it (unverified), for the trail of a refused record."""
    signer = None if data is None else data.get(SIGNER)
    return signer[:100] if isinstance(signer, str) else None


def _trusted_key(name: str, entry, source: str) -> TrustedKey:
    where = f"trust file {source}: keys.{name}"
    if not isinstance(entry, dict) or set(entry) - set(_KEY_FIELDS):
        raise TrustError(f"{where}: expected public_key, roles and an optional until_offset, got {entry!r}"[:300])
    public_key, roles, until = entry.get("public_key"), entry.get("roles"), entry.get("until_offset")
    try:
        if len(base64.b64decode(str(public_key), validate=True)) != 32:
            raise ValueError
    except (binascii.Error, ValueError):
        raise TrustError(f"{where}.public_key: expected the base64 of an Ed25519 public key (NAME.pub), got "
                         f"{str(public_key)[:60]!r}") from None
    if not isinstance(roles, list) or not roles or any(role not in ROLES for role in roles):
        raise TrustError(f"{where}.roles: expected a non-empty list of {', '.join(ROLES)}, got {roles!r}"[:300])
    if until is not None and (not isinstance(until, int) or isinstance(until, bool) or until < 0):
        raise TrustError(f"{where}.until_offset: expected a control-topic offset (an integer >= 0), got {until!r}")
    return TrustedKey(name, str(public_key), frozenset(roles), until)


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"
