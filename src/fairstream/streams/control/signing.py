"""Ed25519 keys and signatures over a control record's canonical bytes (the ground work of issue 33).

Who may change how people are decided is checked by signatures: every control record will carry the signature of a
named key over its **canonical bytes** (:func:`canonical_bytes`: its JSON with sorted keys, no spaces, UTF-8, the
signature left out, the signer's name in), and every reader will verify it against the public keys the pipeline trusts. This
module is the primitive: generate a named key pair (``fairstream keys generate NAME``), sign a record, verify it.

>>> key = generate_key()
>>> signed = sign({"kind": "plan", "version": 2, "action": "approve"}, "alice", key)
>>> verify(signed, {"alice": public_key_text(key)})
'alice'
>>> verify({**signed, "version": 3}, {"alice": public_key_text(key)})
Traceback (most recent call last):
...
fairstream.streams.control.signing.SignatureError: the signature of 'alice' does not match the record's bytes
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

SIGNER, SIGNATURE = "signer", "signature"
"""The fields a signed record adds: the key's name and the base64 signature over the rest."""
KEY_SUFFIX, PUBLIC_SUFFIX = ".key", ".pub"


class SignatureError(ValueError):
    """A record whose signature is missing, malformed, by an unknown key, or does not match; the message says which.

    ``altered`` is true when a trusted key's signature does not match the record's bytes (they were changed).
    """

    def __init__(self, message: str, altered: bool = False):
        super().__init__(message)
        self.altered = altered


def generate_key() -> Ed25519PrivateKey:
    """A new Ed25519 private key."""
    return Ed25519PrivateKey.generate()


def public_key_text(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """The public key as base64 of its 32 raw bytes: what a trust file lists."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return base64.b64encode(public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)).decode()


def canonical_bytes(record: dict) -> bytes:
    """What a signature covers: the record (its signer's name included) without the signature, as JSON with sorted
    keys and no spaces."""
    unsigned = {name: value for name, value in record.items() if name != SIGNATURE}
    # ASCII escapes: any text a JSON reader can hold (an unpaired surrogate too) has bytes, the same for every reader.
    return json.dumps(unsigned, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def sign(record: dict, signer: str, key: Ed25519PrivateKey) -> dict:
    """``record`` with ``signer`` and its signature over the record's canonical bytes.

    Parameters
    ----------
    record : dict
        A JSON-able record (a previous signature is replaced).
    signer : str
        The key's name, as the trust file lists it.
    key : Ed25519PrivateKey
        The signer's private key.

    Returns
    -------
    dict
        The record with ``signer`` and ``signature``.
    """
    if not isinstance(signer, str) or not signer:
        raise SignatureError("a signer needs a name")
    unsigned = {name: value for name, value in record.items() if name not in (SIGNER, SIGNATURE)}
    signed = {**unsigned, SIGNER: signer}
    return {**signed, SIGNATURE: base64.b64encode(key.sign(canonical_bytes(signed))).decode()}


def verify(record: dict, trusted: dict[str, str]) -> str:
    """The name of the key that signed ``record``, if ``trusted`` (name -> :func:`public_key_text`) lists it and the
    signature matches the record's canonical bytes; :class:`SignatureError` otherwise.

    Parameters
    ----------
    record : dict
        A signed record (:func:`sign`).
    trusted : dict of str to str
        The public keys the reader trusts, by name.

    Returns
    -------
    str
        The signer's name.
    """
    signer, signature = record.get(SIGNER), record.get(SIGNATURE)
    if not isinstance(signer, str) or not isinstance(signature, str):
        raise SignatureError("the record is not signed")
    if signer not in trusted:
        raise SignatureError(f"the record is signed by {signer[:100]!r}, a key this pipeline does not trust")
    try:
        raw_signature = base64.b64decode(signature, validate=True)
        public = Ed25519PublicKey.from_public_bytes(base64.b64decode(trusted[signer], validate=True))
    except (binascii.Error, ValueError) as exc:
        raise SignatureError(f"the signature or the trusted key of {signer!r} is not valid base64 "
                             f"({str(exc)[:80]})") from None
    try:
        public.verify(raw_signature, canonical_bytes(record))
    except InvalidSignature:
        raise SignatureError(f"the signature of {signer!r} does not match the record's bytes", altered=True) from None
    except ValueError as exc:  # a value no canonical bytes hold (NaN): it cannot have been signed
        raise SignatureError(f"the record has no canonical bytes ({str(exc)[:80]}): it cannot be signed") from None
    return signer


def write_key_pair(name: str, directory: str | os.PathLike) -> tuple[Path, Path]:
    """Generate a key named ``name`` and write ``NAME.key`` (PKCS#8 PEM, readable by its owner only) and ``NAME.pub``
    (the public key's base64) in ``directory``; an existing key is never overwritten.

    Parameters
    ----------
    name : str
        The key's name (letters, digits, ``.``, ``_``, ``@`` and ``-``).
    directory : str or path
        Where to write the two files (created if missing).

    Returns
    -------
    tuple of Path
        The private and the public key's files.
    """
    if not name or any(not (c.isalnum() or c in "._@-") for c in name):
        raise ValueError(f"a key name is letters, digits, '.', '_', '@' and '-', got {name!r}")
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    private_path, public_path = folder / f"{name}{KEY_SUFFIX}", folder / f"{name}{PUBLIC_SUFFIX}"
    if private_path.exists() or public_path.exists():
        raise FileExistsError(f"a key named {name!r} already exists in {folder}")
    key = generate_key()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    descriptor = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(pem)
    public_path.write_text(public_key_text(key) + "\n")
    return private_path, public_path


def read_private_key(path: str | os.PathLike) -> Ed25519PrivateKey:
    """The Ed25519 private key of a ``NAME.key`` file; a ValueError names a file that holds none."""
    key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path} holds no Ed25519 private key")
    return key


class Signer:
    """A named private key that signs what one writer (a person, the re-fit service, the shadow policy) writes.

    Its name is its key file's name (``NAME.key``), the name the trust file lists. From ``--key FILE`` or,
    without it, the file the environment variable :data:`KEY_ENV` names (:meth:`from_option`).

    Parameters
    ----------
    name : str
        The key's name.
    key : Ed25519PrivateKey
        The private key.
    """

    def __init__(self, name: str, key: Ed25519PrivateKey):
        self.name, self.key = name, key

    def __repr__(self) -> str:
        return f"Signer({self.name!r})"  # never the key

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "Signer":
        """The signer of a ``NAME.key`` file (its name is ``NAME``).

        Parameters
        ----------
        path : str or path
            A private key file written by ``fairstream keys generate``.

        Returns
        -------
        Signer
            The named key.
        """
        path = Path(path)
        try:
            key = read_private_key(path)
        except (OSError, ValueError) as exc:
            raise SignatureError(f"cannot read the signing key {str(path)!r}: "
                                 f"{getattr(exc, 'strerror', None) or exc}") from None
        return cls(path.name[:-len(KEY_SUFFIX)] if path.name.endswith(KEY_SUFFIX) else path.stem, key)

    @classmethod
    def from_option(cls, path: str | None, env: dict | None = None) -> "Signer | None":
        """The signer of ``--key`` ``path``, else of the file ``$FAIRSTREAM_KEY`` names, else None (unsigned).

        Parameters
        ----------
        path : str or None
            The ``--key`` option.
        env : dict or None, default=None
            The environment (``os.environ`` by default).

        Returns
        -------
        Signer or None
            The named key, or None when neither names one.
        """
        path = path or (os.environ if env is None else env).get(KEY_ENV)
        return None if not path else cls.from_file(path)

    def sign(self, record: dict) -> dict:
        """``record`` signed by this key (:func:`sign`)."""
        return sign(record, self.name, self.key)

    def sign_json(self, value: bytes, **fields) -> bytes:
        """A JSON object's bytes with ``fields`` added, signed by this key (the object with ``signer`` and
        ``signature``)."""
        return json.dumps(self.sign({**json.loads(value), **fields}), sort_keys=True, allow_nan=False).encode("utf-8")


KEY_ENV = "FAIRSTREAM_KEY"
"""The environment variable naming the private key file a process signs with when no ``--key`` is given."""
