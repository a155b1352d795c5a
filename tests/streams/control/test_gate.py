"""Every reader's gate (issue 33), in memory: the hash chain of the trail (in order, swapped, dropped, replayed, a lost
race), the pipeline's own promotion policy for each action, and the unsigned pipeline (trust none)."""

from __future__ import annotations

import json
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.streams.control.client import ControlLog
from fairstream.streams.control.gate import GENESIS, Authority, record_hash, seal, unsigned_warning
from fairstream.streams.control.records import VersionLedger, control_key, decision_record, parse_control
from fairstream.streams.control.signing import Signer, generate_key, public_key_text, sign
from fairstream.streams.control.trust import Trust
from fairstream.streams.schemas import ControlRecord

PIPELINE = "prod.control"
SIGNERS = {name: Signer(name, generate_key()) for name in ("pub", "appr", "ops", "pol", "all")}
ROLES = {"pub": ["publisher"], "appr": ["approver"], "ops": ["operator"], "pol": ["policy"],
         "all": ["publisher", "approver", "operator", "policy"]}
TRUST = Trust.parse("".join(f'[keys.{name}]\npublic_key = "{public_key_text(s.key)}"\nroles = {json.dumps(ROLES[name])}\n'
                            for name, s in SIGNERS.items()), "trust.toml")


def sha(n: int) -> str:
    return f"{n:064x}"


def publish(version: int, candidate: bool = False, kind: str = "plan") -> ControlRecord:
    return ControlRecord(kind, version, sha(version), path="p", actor="refit@vm", candidate=True if candidate else None)


def decision(version: int, action: str, actor: str = "Chief Risk Officer") -> ControlRecord:
    return decision_record("plan", version, sha(version), action, actor, reason="r")


def rollback(version: int) -> ControlRecord:
    return ControlRecord("plan", version, sha(version), action="rollback", path="p", actor="ops")


def chain(records, signer="all", pipeline=PIPELINE, head=GENESIS) -> list[tuple[ControlRecord, bytes]]:
    """``records`` sealed one after the other, each naming the one before: (record, value) as written."""
    sealed = []
    for record in records:
        placed, _, value = seal(record, head, pipeline, None if signer is None else SIGNERS[signer])
        sealed.append((placed, value))
        head = record_hash(value)
    return sealed


def admit_all(sealed, authority, offsets=None):
    gate, ledger = authority.gate(), VersionLedger()
    offsets = range(len(sealed)) if offsets is None else offsets
    return [gate.admit(record, value, offset, ledger) for (record, value), offset in zip(sealed, offsets)], gate


SIGNED = Authority(TRUST, "auto", PIPELINE)
UNSIGNED = Authority(Trust.none(), "auto", PIPELINE)


# --------------------------------------------------------------------------- the chain


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 8))
def test_a_sealed_trail_read_in_order_is_admitted_whole(n):
    sealed = chain([publish(v) for v in range(1, n + 1)])
    verdicts, gate = admit_all(sealed, SIGNED)
    assert [(v.refusal, v.remark, v.signer, v.breaks_trail) for v in verdicts] == [(None, None, "all", False)] * n
    assert gate.head == record_hash(sealed[-1][1])
    assert [record.previous for record, _ in sealed] == [GENESIS] + [record_hash(v) for _, v in sealed[:-1]]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(3, 8), data=st.data())
def test_two_records_swapped_the_first_breaks_the_trail_and_the_second_is_refused(n, data):
    i = data.draw(st.integers(0, n - 2))
    sealed = chain([publish(v) for v in range(1, n + 1)])
    swapped = sealed[:i] + [sealed[i + 1], sealed[i]] + sealed[i + 2:]
    offsets = [10 * (j + 1) for j in range(n)]  # room between offsets: the version rule stays out of it
    verdicts, _ = admit_all(swapped, SIGNED, offsets=offsets)
    early, late = verdicts[i], verdicts[i + 1]
    assert early.refusal is None and early.remark.startswith("a break in the trail") and early.breaks_trail
    assert late.category == "replay" and late.refusal.startswith("out of order") and late.breaks_trail
    assert all(v.refusal is None and v.remark is None for j, v in enumerate(verdicts) if j not in (i, i + 1))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 8), data=st.data())
def test_a_dropped_record_leaves_the_next_one_admitted_with_a_remark_that_breaks_the_trail(n, data):
    i = data.draw(st.integers(0, n - 2))
    sealed = chain([publish(v) for v in range(1, n + 1)])
    kept = [pair for j, pair in enumerate(sealed) if j != i]
    offsets = [j for j in range(n) if j != i]  # the offset of the dropped record left as a hole (as compaction does)
    verdicts, _ = admit_all(kept, SIGNED, offsets)
    after = verdicts[i]
    assert after.refusal is None and after.breaks_trail and "one before it was dropped or altered" in after.remark
    assert [j for j, v in enumerate(verdicts) if v.refusal is not None or v.remark is not None] == [i]


@pytest.mark.parametrize("rewrite", ["drop", "swap"])
def test_a_trail_rewritten_with_renumbered_offsets_shows_a_break(rewrite):
    sealed = chain([publish(v) for v in range(1, 6)])
    rewritten = sealed[:2] + sealed[3:] if rewrite == "drop" else sealed[:1] + [sealed[2], sealed[1]] + sealed[3:]
    verdicts, _ = admit_all(rewritten, SIGNED)  # offsets 0, 1, 2, ...: a copy of the trail written again
    assert any(v.breaks_trail for v in verdicts), [(v.category, v.refusal) for v in verdicts]


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 6), data=st.data())
def test_an_admitted_record_sent_again_is_a_replay(n, data):
    sealed = chain([publish(v) for v in range(1, n + 1)])
    again = data.draw(st.integers(0, n - 1))
    verdicts, gate = admit_all(sealed + [sealed[again]], SIGNED)
    assert verdicts[-1].category == "replay" and verdicts[-1].breaks_trail
    assert verdicts[-1].refusal == f"a replay of the record at offset {again}, sent again"
    assert gate.head == record_hash(sealed[-1][1])  # the replay moved nothing


def test_two_writers_sealing_on_the_same_head_the_second_is_stale_and_its_writer_can_write_again():
    (first, v1), = chain([publish(1)])
    gate, ledger = SIGNED.gate(), VersionLedger()
    assert gate.admit(first, v1, 0, ledger).refusal is None
    head = gate.head
    a, _, va = seal(publish(2), head, PIPELINE, SIGNERS["pub"])
    b, _, vb = seal(publish(3), head, PIPELINE, SIGNERS["all"])
    assert gate.admit(a, va, 1, ledger).refusal is None
    lost = gate.admit(b, vb, 2, ledger)
    assert lost.category == "stale" and lost.refusal.startswith("lost a race to the record at offset 1")
    assert not lost.breaks_trail and lost.signer == "all"
    again, _, vb2 = seal(publish(3), gate.head, PIPELINE, SIGNERS["all"])  # read back, written again
    assert gate.admit(again, vb2, 3, ledger).refusal is None


def test_a_record_altered_on_the_way_is_refused_as_altered_and_the_next_one_breaks_the_trail():
    sealed = chain([publish(1), publish(2), publish(3)])
    record, value = sealed[1]
    data = json.loads(value)
    data["candidate"] = True  # the one bit that decides whether it serves at once
    altered = json.dumps(data, sort_keys=True).encode()
    verdicts, _ = admit_all([sealed[0], (parse_control(altered), altered), sealed[2]], SIGNED)
    assert verdicts[1].category == "untrusted" and "does not match" in verdicts[1].refusal and verdicts[1].breaks_trail
    assert verdicts[2].refusal is None and verdicts[2].breaks_trail


def test_a_signed_record_without_previous_is_refused():
    placed, _, value = seal(publish(1), GENESIS, PIPELINE, SIGNERS["pub"])
    data = json.loads(value)
    del data["previous"]
    value = json.dumps(sign(data, "pub", SIGNERS["pub"].key)).encode()
    verdict = SIGNED.gate().admit(parse_control(value), value, 0, VersionLedger())
    assert verdict.category == "stale" and "names no previous record" in verdict.refusal


# --------------------------------------------------------------------------- who signed it


@pytest.mark.parametrize("signer, category, message", [
    (None, "unsigned", "not signed: this pipeline takes only records signed by a key of its trust file"),
    ("appr", "role", "signed by 'appr', whose roles are approver: a publish needs the publisher role"),
])
def test_an_unsigned_or_role_less_publish_is_refused(signer, category, message):
    (record, value), = chain([publish(1)], signer=signer)
    verdict = SIGNED.gate().admit(record, value, 0, VersionLedger())
    assert (verdict.category, verdict.refusal, verdict.signer) == (category, message, signer)


def test_an_untrusted_key_is_untrusted_whatever_its_name():
    mallory = Signer("mallory", generate_key())
    record, _, value = seal(publish(1), GENESIS, PIPELINE, mallory)
    verdict = SIGNED.gate().admit(record, value, 0, VersionLedger())
    assert verdict.category == "untrusted" and verdict.signer == "mallory"


def test_an_untrusted_key_whose_name_contains_role_is_still_untrusted():
    impostor = Signer("role-admin", generate_key())
    record, _, value = seal(publish(1), GENESIS, PIPELINE, impostor)
    assert SIGNED.gate().admit(record, value, 0, VersionLedger()).category == "untrusted"


def test_a_record_of_another_pipeline_is_refused():
    (record, value), = chain([publish(1)], pipeline="staging.control")
    verdict = SIGNED.gate().admit(record, value, 0, VersionLedger())
    assert verdict.category == "pipeline" and "not for prod.control" in verdict.refusal


def test_a_log_reader_never_raises_on_a_record_claiming_a_trusted_signer():
    """ControlLog.add "never raises": a record of the topic with an unpaired surrogate in its actor, claiming
    a trusted signer, is one refused entry (``artifacts history`` / ``list`` / every write read the log so)."""
    placed, _, value = seal(publish(1), GENESIS, PIPELINE, SIGNERS["pub"])
    data = json.loads(value)
    data["actor"] = "\ud800"
    value = json.dumps(data).encode()  # \ud800 escaped: valid JSON, valid UTF-8
    record = parse_control(value)
    log = ControlLog(gate=SIGNED.gate())
    message = type("M", (), {"offset": 0, "key": control_key(record, value), "value": value})
    log.add(message)  # canonical bytes escape an unpaired surrogate: a refusal, never an error
    assert log.entries[0].refusal is not None


# --------------------------------------------------------------------------- the pipeline's promotion policy

ACTIONS = {
    "publish": lambda: [publish(1)],
    "candidate": lambda: [publish(1, candidate=True)],
    "approve": lambda: [publish(1, candidate=True), decision(1, "approve")],
    "reject": lambda: [publish(1, candidate=True), decision(1, "reject")],
    "promote": lambda: [publish(1, candidate=True), decision(1, "promote", "shadow-policy@w")],
    "retire": lambda: [publish(1, candidate=True), decision(1, "retire", "shadow-policy@w")],
}


def rollback_setup(promotion: str) -> list[ControlRecord]:
    """Two versions that served, then a rollback to the first, as each promotion lets them serve."""
    if promotion == "approve":
        return [publish(1, True), decision(1, "approve"), publish(2, True), decision(2, "approve"), rollback(1)]
    return [publish(1), publish(2, True), decision(2, "promote", "shadow-policy@w"), rollback(1)]


REFUSED_BY = {  # (action, promotion) -> the refusal's start; anything else is admitted
    ("approve", "shadow"): "promotion is 'shadow': only the shadow policy decides a candidate, not an approve",
    ("reject", "shadow"): "promotion is 'shadow': only the shadow policy decides a candidate, not a reject",
    ("promote", "approve"): "promotion is 'approve': only a person decides a candidate (approve or reject), not a "
                            "promote",
    ("retire", "approve"): "promotion is 'approve': only a person decides a candidate (approve or reject), not a retire",
    ("publish", "approve"): "promotion is 'approve': a publish that would serve at once is refused (publish it as a "
                            "candidate a person approves)",
}


@pytest.mark.parametrize("authority", [SIGNED, UNSIGNED], ids=["signed", "unsigned"])
@pytest.mark.parametrize("promotion", ["auto", "shadow", "approve"])
@pytest.mark.parametrize("action", [*sorted(ACTIONS), "rollback"])
def test_the_policy_table(action, promotion, authority):
    records = rollback_setup(promotion) if action == "rollback" else ACTIONS[action]()
    authority = Authority(authority.trust, promotion, PIPELINE)
    sealed = chain(records, signer="all" if authority.trust.signed else None)
    verdicts, _ = admit_all(sealed, authority)
    last = verdicts[-1]
    expected = REFUSED_BY.get((action, promotion))
    if expected is None:
        assert [v.refusal for v in verdicts] == [None] * len(verdicts)
    else:
        assert [v.refusal for v in verdicts[:-1]] == [None] * (len(verdicts) - 1)
        assert (last.category, last.refusal) == ("policy", expected)
        assert last.signer == ("all" if authority.trust.signed else None)


def test_under_shadow_a_publish_serving_at_once_is_refused_once_a_plan_served():
    sealed = chain([publish(1), publish(2), publish(3, candidate=True), decision(3, "promote", "shadow-policy@w")])
    authority = Authority(TRUST, "shadow", PIPELINE)
    verdicts, _ = admit_all(sealed, authority)
    assert verdicts[0].refusal is None  # the first plan serves at once: nothing to compare it with
    assert verdicts[1].category == "policy" and "the shadow policy decides" in verdicts[1].refusal
    assert [v.refusal for v in verdicts[2:]] == [None, None]  # the refused publish moved nothing in the chain


def test_a_reader_without_a_promotion_enforces_none():
    verdicts, _ = admit_all(chain([publish(1), publish(2, candidate=True), decision(2, "promote")]),
                            Authority(TRUST, None, PIPELINE))
    assert [v.refusal for v in verdicts] == [None, None, None]


# --------------------------------------------------------------------------- the unsigned pipeline


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 7), data=st.data())
def test_unsigned_records_are_admitted_and_the_chain_never_refuses(n, data):
    sealed = chain([publish(v) for v in range(1, n + 1)], signer=None)
    order = data.draw(st.permutations(range(n)))
    shuffled = [sealed[j] for j in order]
    gate, ledger = UNSIGNED.gate(), VersionLedger()
    for offset, (record, value) in enumerate(shuffled):
        verdict = gate.admit(record, value, offset, ledger)
        assert verdict.category in (None, "version")  # never stale, replay, unsigned: only the version rule
        assert verdict.signer is None
    assert gate.admit(*sealed[order[0]], n, ledger).category != "replay"  # a replay too: left to the version rule


def test_an_unsigned_trail_still_shows_its_breaks():
    sealed = chain([publish(1), publish(2, candidate=True), decision(2, "approve"), publish(3)], signer=None)
    verdicts, _ = admit_all(sealed[:1] + sealed[2:], UNSIGNED, offsets=[0, 2, 3])  # the candidate dropped
    assert verdicts[1].refusal is not None  # an approve of nothing: the version rule
    assert verdicts[2].refusal is None and verdicts[2].breaks_trail  # it follows the approve no reader admitted
    assert unsigned_warning(UNSIGNED).startswith("this pipeline is unsigned") and unsigned_warning(SIGNED) is None


@pytest.mark.parametrize("promotion, action", [("approve", "publish"), ("approve", "promote"), ("shadow", "approve")])
def test_an_unsigned_pipeline_still_enforces_its_policy(promotion, action):
    records = ACTIONS[action]()
    verdicts, _ = admit_all(chain(records, signer=None), Authority(Trust.none(), promotion, PIPELINE))
    assert verdicts[-1].category == "policy"


def test_a_record_after_one_whose_key_was_revoked_is_no_break_in_the_trail():
    """Revoking a key refuses what it signed; the trusted records after those follow a record that is still there:
    --verify must not call that trail rewritten (it would, were the refused record's hash unknown)."""
    first = chain([publish(1)], signer="pub")
    later = chain([publish(2), publish(3)], signer="all", head=record_hash(first[0][1]))
    without_pub = Authority(Trust(MappingProxyType({k: v for k, v in TRUST.keys.items() if k != "pub"}), "t.toml"),
                            "auto", PIPELINE)
    verdicts, _ = admit_all(first + later, without_pub)
    assert verdicts[0].category == "untrusted" and not verdicts[0].breaks_trail
    assert "its signer's key was revoked" in verdicts[1].remark
    assert not any(verdict.breaks_trail for verdict in verdicts), [(v.category, v.remark) for v in verdicts]
    # Moved after the trail went on (re-sent later: compaction then drops the originals), the same revoked record no
    # longer excuses the record after it: the move shows.
    moved = chain([publish(1, kind="scorer")], signer="all") + first + later
    verdicts, _ = admit_all(moved, without_pub)
    assert verdicts[1].category == "untrusted" and verdicts[2].breaks_trail, [(v.category, v.remark) for v in verdicts]
    altered = first[0][1].replace(b'"refit@vm"', b'"refit@vX"')  # the same record with its bytes changed: a break
    verdicts, _ = admit_all([(first[0][0], altered)] + later, SIGNED)
    assert verdicts[0].breaks_trail and verdicts[1].breaks_trail


def test_a_field_no_canonical_bytes_hold_is_refused_by_every_reader_never_raised():
    """NaN or 1e999 in any field of a record claiming a trusted signer: one message must not stop a reader."""
    (record, value), = chain([publish(1)], signer="pub")
    for poison in (b'NaN', b'1e999', b'-Infinity'):
        hostile = value[:-1] + b', "x": ' + poison + b"}"
        message = type("Message", (), {"offset": 0, "key": control_key(record, hostile), "value": hostile})
        log = ControlLog(gate=SIGNED.gate())
        log.add(message)
        assert log.skipped or log.entries[0].refusal is not None
