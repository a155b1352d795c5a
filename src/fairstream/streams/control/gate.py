"""Every reader's admission of a control record: who signed it, whether their role and the pipeline's promotion
policy allow it, and where it sits in the audit trail.

Workers, the monitoring agent, the re-fit service and every command that lists, reports or verifies the
trail read the control topic through one :class:`ControlGate` each, built from the pipeline's own
:class:`Authority` (its trust file, its promotion policy, its control topic): never from what a record
claims. A record takes effect only when, in this order,

1. **it is signed** by a key the trust file lists, with the role its action needs
   (:data:`~fairstream.streams.control.trust.ROLE_OF`), for this pipeline (``pipeline`` names its control
   topic: a record copied from another pipeline is refused); skipped under ``trust = "none"``;
2. **the pipeline's promotion policy allows it** (whatever the publisher's config said): under ``approve``
   a publish that would serve at once is refused and so are the shadow policy's decisions; under
   ``shadow`` only the policy decides (``approve``/``reject`` refused) and a publish of a record-chain
   kind that served before must be a candidate (:func:`publish_mode`);
3. **it follows the trail**: ``previous`` is the sha256 of the value of the last record admitted. One
   naming an earlier admitted record is refused on a signed pipeline: *stale* when that record already
   has an admitted successor (it lost a race to it: its writer reads back and writes again), a *replay*
   when it is an admitted record sent again or otherwise out of order. One naming a record this reader
   never admitted (dropped or altered) is admitted (its signature and role hold) with a remark, and
   ``fairstream artifacts history --verify`` names the break;
4. **the version rule admits it** (:class:`~fairstream.streams.control.records.VersionLedger`).

A refused record changes nothing; its verdict keeps the signer it claims and a :data:`CATEGORIES` name
for the metric.

>>> from fairstream.streams.control.records import VersionLedger, encode_control
>>> from fairstream.streams.schemas import ControlRecord
>>> gate, ledger = Authority(promotion="approve").gate(), VersionLedger()
>>> plan = ControlRecord("plan", 1, "a" * 64, path="p")
>>> gate.admit(plan, encode_control(plan), 0, ledger).refusal
"promotion is 'approve': a publish that would serve at once is refused (publish it as a candidate a person approves)"
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from fairstream.models.kinds import MODULE_KINDS
from fairstream.streams.schemas import ControlRecord

from fairstream.streams.config import PROMOTIONS

from .records import ControlError, VersionLedger, control_key, encode_control, parse_control, shown
from .trust import ROLE_OF, Trust, TrustError, claimed_signer

GENESIS = "0" * 64
RACE, DISTRUSTED = "lost a race", "it follows the record"
"""The ``previous`` of a pipeline's first record."""
CATEGORIES = ("unreadable", "unsigned", "untrusted", "role", "pipeline", "policy", "stale", "replay", "version",
              "load")
"""Why a record was refused, as a metric label: not a record under its own key, not signed, a signature that does
not verify (unknown key, altered bytes, rotated key), a key without the role, another pipeline's record, the
promotion policy, a race lost to another writer (``stale``: its writer writes it again), a replay or a record out
of the trail's order, the version rule, an artifact the reader cannot load."""


def record_hash(value: bytes) -> str:
    """The sha256 of a record's value: what the next record names as ``previous``."""
    return hashlib.sha256(value).hexdigest()


# --------------------------------------------------------------------------- candidate or not


@dataclass(frozen=True)
class PublishMode:
    """Whether a publish is a candidate (it serves once promoted or approved) or serves at once, and why."""

    candidate: bool
    why: str


def publish_mode(promotion: str, ledger: VersionLedger, kind: str) -> PublishMode:
    """Whether a publish of ``kind`` under the pipeline's ``promotion`` must be a candidate, from the log's ``ledger``.

    The one place this is decided: publishers follow it (:meth:`ControlClient.publish_under`) and every
    reader's gate refuses a publish that serves at once where it says "candidate". ``"auto"``: never;
    ``"approve"``: always, the first version too (a person approves it; until then the workers hold
    input); ``"shadow"``: only when a version of ``kind`` served before (the shadow policy compares the
    candidate with the active chain) and ``kind`` is applied by the record chain (the only one measured
    in shadow); otherwise it serves at once, as under ``"auto"`` (its validation decided).

    Parameters
    ----------
    promotion : str
        The pipeline's ``promotion`` ("auto", "shadow" or "approve").
    ledger : VersionLedger
        The version rule fed the log so far.
    kind : str
        The artifact kind published.

    Returns
    -------
    PublishMode
        Whether it is a candidate, and why.

    >>> publish_mode("shadow", VersionLedger(), "plan").why
    "promotion is 'shadow', but no plan version served yet (there is no active chain to compare it with): it serves at
    once, as under 'auto'"
    """
    if promotion not in PROMOTIONS:
        raise ControlError(f"promotion must be one of {', '.join(PROMOTIONS)}, got {shown(promotion)}")
    if promotion == "auto":
        return PublishMode(False, "promotion is 'auto': it serves at once")
    if promotion == "approve":
        return PublishMode(True, "promotion is 'approve': it serves once a person approves it")
    module = MODULE_KINDS.get(kind)
    if module is None or module.capabilities.agent != "records":
        return PublishMode(False, f"promotion is 'shadow', but the shadow policy measures only the record chain, not "
                                  f"the {kind}: it serves at once, as under 'auto'")
    if not ledger.ever_served(kind):
        return PublishMode(False, f"promotion is 'shadow', but no {kind} version served yet (there is no active chain "
                                  "to compare it with): it serves at once, as under 'auto'")
    return PublishMode(True, "promotion is 'shadow': the workers shadow it until the shadow policy promotes or "
                             "retires it")


# --------------------------------------------------------------------------- the gate


@dataclass(frozen=True)
class Verdict:
    """What a reader made of one record: ``refusal`` (None: it takes effect) and its ``category``, the ``signer``
    (verified, or only claimed when refused), and a ``remark`` on an admitted record (a break in the trail)."""

    refusal: str | None
    signer: str | None = None
    category: str | None = None
    remark: str | None = None
    altered: bool = False  # a trusted key's signature that does not match the bytes: they were changed

    @property
    def breaks_trail(self) -> bool:
        """Whether the record shows the trail was rewritten: an altered record, a replay or a record out of order,
        or one admitted after a record that is missing."""
        benign = self.remark is None or self.remark.startswith((RACE, DISTRUSTED))
        return self.altered or self.category == "replay" or not benign

@dataclass(frozen=True)
class Authority:
    """Who may change what serves in one pipeline: its trust, its promotion policy, its control topic.

    Parameters
    ----------
    trust : Trust, default=Trust.none()
        The trusted keys and roles (unsigned by default).
    promotion : str or None, default=None
        The pipeline's promotion policy, enforced by every reader; None enforces none (a reader of bare records).
    pipeline : str or None, default=None
        The pipeline's control topic: a signed record must name it.
    """

    trust: Trust = field(default_factory=Trust.none)
    promotion: str | None = None
    pipeline: str | None = None

    @classmethod
    def of(cls, config) -> "Authority":
        """The authority of a pipeline config (its trust file read now).

        Parameters
        ----------
        config : PipelineConfig
            The pipeline.

        Returns
        -------
        Authority
            Its trust, promotion policy and control topic.
        """
        return cls(Trust.load(config.trust), config.promotion, config.topics.control)

    def gate(self) -> "ControlGate":
        """A fresh gate for one reading of the log from its beginning.

        Returns
        -------
        ControlGate
            A gate at the trail's start.
        """
        return ControlGate(self)


class ControlGate:
    """One reader's admission of the control topic's records, in log order (see the module docstring).

    Parameters
    ----------
    authority : Authority
        The pipeline's trust, promotion policy and control topic.
    """

    def __init__(self, authority: Authority):
        self.authority = authority
        self.head = GENESIS  # the hash of the last admitted record: what the next one names as previous
        self.trail: dict[str, int] = {GENESIS: -1}  # hash of every admitted record -> its offset
        self.successor: dict[str, int] = {}  # hash of an admitted record -> offset of the admitted one naming it
        # hash of a record whose key was revoked (it is not in the trust file) and that followed the trail's last
        # record when it came -> (its offset, that record's hash): one that follows it, while the trail has not moved
        # since, follows a record that is there, not a missing one
        self.distrusted: dict[str, tuple[int, str]] = {}

    def copy(self) -> "ControlGate":
        """A gate at the same place of the trail (to try a record without admitting it).

        Returns
        -------
        ControlGate
            An independent copy.
        """
        twin = ControlGate(self.authority)
        twin.head, twin.trail, twin.successor = self.head, dict(self.trail), dict(self.successor)
        twin.distrusted = dict(self.distrusted)
        return twin

    def admit(self, record: ControlRecord, value: bytes, offset: int, ledger: VersionLedger) -> Verdict:
        """Check ``record`` (``value``: its bytes on the topic, at ``offset``) and feed it to ``ledger`` if it passes.

        Parameters
        ----------
        record : ControlRecord
            The parsed record.
        value : bytes
            Its message value, as read.
        offset : int
            Its offset on the control topic.
        ledger : VersionLedger
            The reader's version rule (fed only a record that passes every other check).

        Returns
        -------
        Verdict
            None as ``refusal`` when it takes effect.
        """
        digest = record_hash(value)
        signer, refusal, category, altered = self._who(record, value, offset)
        # Where a record sits in the trail matters only if its writer may write at all: a forged record is no part of it.
        remark, out_of_order = self._place(record, digest) if refusal is None else (None, None)
        if refusal is None:
            refusal, category = self._policy(record, ledger), "policy"
        if refusal is None and out_of_order is not None and self.authority.trust.signed:
            refusal, category = remark, out_of_order
        if refusal is None:
            refusal, category = ledger.admit(record, offset), "version"
        if refusal is not None:
            if category == "revoked":
                category = "untrusted"
                if record.previous == self.head:
                    self.distrusted[digest] = (offset, self.head)
            return Verdict(refusal, signer, category, None if category == out_of_order else remark, altered)
        if record.previous is not None and record.previous in self.trail:
            self.successor.setdefault(record.previous, offset)
        self.head, self.trail[digest] = digest, offset
        return Verdict(None, signer, None, remark)

    def _who(self, record: ControlRecord, value: bytes,
             offset: int) -> tuple[str | None, str | None, str | None, bool]:
        """(signer, refusal, category, altered): the verified signer of a signed pipeline's record, else the claimed
        one; category ``revoked`` (reported as ``untrusted``) for a key the trust file does not list."""
        trust, claimed = self.authority.trust, record.signer
        if not trust.signed:
            return claimed, None, None, False
        if record.signer is None or record.signature is None:
            return claimed, "not signed: this pipeline takes only records signed by a key of its trust file", \
                "unsigned", False
        try:
            signer = trust.signer_of(json.loads(value), ROLE_OF[record.action], offset)
        except TrustError as exc:
            category = "revoked" if exc.unknown_key else exc.category
            return claimed_signer({"signer": claimed}), str(exc), category, exc.altered
        except ValueError as exc:  # bytes parse_control took but a signature cannot cover: refused, never raised
            return claimed_signer({"signer": claimed}), f"unreadable for its signature: {shown(str(exc))}", \
                "untrusted", False
        pipeline = self.authority.pipeline
        if pipeline is not None and record.pipeline != pipeline:
            return signer, (f"written for pipeline {shown(record.pipeline)}, not for {pipeline}: a record copied from "
                            "another pipeline's control topic is refused"), "pipeline", False
        if record.previous is None:
            return signer, "it names no previous record: a signed record names the record before it", "stale", False
        return signer, None, None, False

    def _policy(self, record: ControlRecord, ledger: VersionLedger) -> str | None:
        """Why the pipeline's own promotion policy refuses ``record``, or None (whatever its writer's config said)."""
        promotion = self.authority.promotion
        if promotion is None:
            return None
        if record.action == "publish" and not record.candidate:
            mode = publish_mode(promotion, ledger, record.kind)
            if mode.candidate:
                how = "a person approves" if promotion == "approve" else "the shadow policy decides"
                return (f"promotion is {promotion!r}: a publish that would serve at once is refused (publish it as a "
                        f"candidate {how})")
        if record.action in ("approve", "reject") and promotion == "shadow":
            return (f"promotion is 'shadow': only the shadow policy decides a candidate, not "
                    f"{_article(record.action)} {record.action}")
        if record.action in ("promote", "retire") and promotion == "approve":
            return f"promotion is 'approve': only a person decides a candidate (approve or reject), not a {record.action}"
        return None

    def _place(self, record: ControlRecord, digest: str) -> tuple[str | None, str | None]:
        """(a remark on where ``record`` sits in the trail, the category that refuses it on a signed pipeline: None,
        ``stale`` or ``replay``)."""
        previous = record.previous
        if previous is None or previous == self.head:
            return None, None
        if digest in self.trail:
            return f"a replay of the record at offset {self.trail[digest]}, sent again", "replay"
        if previous in self.successor:
            return (f"{RACE} to the record at offset {self.successor[previous]}, which follows the same record "
                    f"(offset {self.trail[previous]}); its writer writes it again"), "stale"
        if previous in self.trail:
            return (f"out of order: it follows the record at offset {self.trail[previous]}, but the trail went on from "
                    f"there without it (a record moved or replayed)"), "replay"
        revoked = self.distrusted.get(previous)
        if revoked is not None and revoked[1] == self.head:  # it came last, and nothing was admitted since
            return (f"{DISTRUSTED} at offset {revoked[0]}, which this reader refuses: its signer's key was "
                    "revoked"), None
        return (f"a break in the trail: it follows a record no reader admitted (previous {previous[:12]}): one before "
                "it was dropped or altered"), None


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def unsigned_warning(authority: Authority) -> str | None:
    """The one line a process of an unsigned pipeline logs at start, or None for a signed one."""
    if authority.trust.signed:
        return None
    return ("this pipeline is unsigned ([pipeline] trust = \"none\"): anyone who can write its control topic can "
            "change what serves; name a trust file for production (docs/production.md, Security)")



# --------------------------------------------------------------------------- writing


def seal(record: ControlRecord, previous: str, pipeline: str | None, signer=None) -> tuple[ControlRecord, bytes, bytes]:
    """``record`` placed after ``previous`` in ``pipeline``'s trail and signed by ``signer``: (record, key, value).

    What every writer of the control topic sends (the client, the shadow policy, the re-fit service):
    the readers' gate admits it if the signer's key has the role and ``previous`` is still the trail's
    last record when it is read.

    Parameters
    ----------
    record : ControlRecord
        The record to write (its trust fields are replaced).
    previous : str
        The hash of the trail's last admitted record (:attr:`ControlGate.head`).
    pipeline : str or None
        The pipeline's control topic.
    signer : Signer or None, default=None
        The writer's key; None writes it unsigned.

    Returns
    -------
    tuple
        The record as readers parse it, its control key and its value.
    """
    placed = ControlRecord(**{**record.asdict(), "pipeline": pipeline, "previous": previous, "signer": None,
                              "signature": None})
    value = encode_control(placed)
    if signer is not None:
        value = signer.sign_json(value)
    placed = parse_control(value)  # what every reader will parse: a record no reader takes is never written
    return placed, control_key(placed, value), value
