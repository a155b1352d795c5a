"""The content-addressed artifact store: one file per payload sha256, shared by publishers and workers.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from fairstream.repair import artifacts
from fairstream.repair.artifacts import Artifact, ArtifactError

log = logging.getLogger(__name__)
_SHA256 = re.compile(r"[0-9a-f]{64}")
_STORE_SUFFIX = ".fsa"
# --------------------------------------------------------------------------- the store


class ArtifactStore:
    """Encoded artifacts on disk, one file per payload: ``<root>/<sha256>.fsa``.

    The name is the payload's sha256, so a file holds the same arrays whatever version number a
    control record gives them; :meth:`get` re-verifies the hash, so a file changed on disk is refused.
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def path_for(self, sha256: str) -> Path:
        # The hash may come from a Kafka message: insist on 64 hex digits, so it cannot be a path.
        """Where the artifact with payload ``sha256`` is stored."""
        if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
            raise ArtifactError(f"artifact store keys are 64 lowercase hex digits (a sha256), got {sha256!r}")
        return self.root / f"{sha256}{_STORE_SUFFIX}"

    def put(self, artifact: Artifact) -> Path:
        """Store ``artifact`` (atomic write) and return its path; storing it again changes nothing.

        A file already holding the same payload is kept even if its version number differs
        (workers take the version from the control record). The parameters are sealed in the
        payload, so the same hash means the same behaviour; a different kind or extra is refused.
        """
        path = self.path_for(artifact.sha256)
        existing = self._readable(artifact.sha256) if path.exists() else None
        if existing is not None:
            _check_same_behaviour(existing, artifact)
            return path
        self.root.mkdir(parents=True, exist_ok=True)
        artifacts.atomic_write(path, artifacts.encode(artifact))
        return path

    def get(self, sha256: str) -> Artifact:
        """The artifact whose payload has this sha256, verified (size, hash) before it is parsed."""
        path = self.path_for(sha256)
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            raise ArtifactError(f"artifact {sha256[:12]} is not in the store {self.root} (no {path.name})") from None
        artifact = artifacts.decode(blob)
        if artifact.sha256 != sha256:
            raise ArtifactError(f"store file {path} holds payload {artifact.sha256[:12]}, not {sha256[:12]}; refused")
        return artifact

    def _readable(self, sha256: str) -> Artifact | None:
        try:
            return self.get(sha256)
        except ArtifactError as exc:
            log.warning("replacing damaged artifact store file for %s: %s", sha256[:12], exc)
            return None


def _check_same_behaviour(stored: Artifact, new: Artifact) -> None:
    fields = ("kind", "parameters", "extra", "schema_version")
    differing = [name for name in fields if getattr(stored.manifest, name) != getattr(new.manifest, name)]
    if differing:
        raise ArtifactError(
            f"the store already holds payload {new.sha256[:12]} with different {', '.join(differing)}; a store "
            "keyed by payload hash cannot hold both (re-fit, or change the arrays, to publish these settings)"
        )
