"""The pipeline's trust file (issue 33), as a hostile writer meets it: every error of the file names the key and the
field, and :meth:`Trust.signer_of` names the signer of a record only when its key is trusted, has the record's role
and was not rotated out; any change to a signed record, whatever the field, is refused."""

from __future__ import annotations

import hashlib
import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.streams.control.signing import SIGNATURE, SIGNER, generate_key, public_key_text, sign
from fairstream.streams.control.trust import NONE, ROLE_OF, ROLES, Trust, TrustError, claimed_signer

# Fixed keys: parameter ids hold public keys, and every pytest-xdist worker must collect the same ids.
KEYS = {name: Ed25519PrivateKey.from_private_bytes(hashlib.sha256(name.encode()).digest())
        for name in ("publisher", "approver", "operator", "policy", "requester", "old")}
PUB = {name: public_key_text(key) for name, key in KEYS.items()}


def trust_text(**entries: str) -> str:
    """A trust file: one ``[keys.NAME]`` table per keyword (its body as given)."""
    return "".join(f'[keys."{name}"]\n{body}\n' for name, body in entries.items())


def entry(name: str, roles: list[str], extra: str = "") -> str:
    return f'public_key = "{PUB[name]}"\nroles = {json.dumps(roles)}\n{extra}'


TRUST = Trust.parse(trust_text(
    publisher=entry("publisher", ["publisher"]),
    approver=entry("approver", ["approver"]),
    operator=entry("operator", ["operator"]),
    policy=entry("policy", ["policy"]),
    requester=entry("requester", ["requester"]),
    old=entry("old", ["publisher", "approver", "operator", "policy"], "until_offset = 10"),
), "trust.toml")

RECORD = {"kind": "plan", "version": 2, "sha256": "a" * 64, "action": "publish", "path": "p", "published_at": 1.5,
          "actor": "refit@vm", "reason": "Alertmanager: FairstreamFairnessDrift", "statistics": {"E": 0.25},
          "candidate": True, "pipeline": "prod.control", "previous": "b" * 64}


# --------------------------------------------------------------------------- the file


@pytest.mark.parametrize("text, message", [
    ("", "trust file t.toml: expected [keys.NAME] tables and nothing else, got no keys"),
    ("[keys]\n", "trust file t.toml: expected [keys.NAME] tables and nothing else, got no keys"),
    ('[other]\nx = 1\n[keys.a]\npublic_key = "x"\n', "got ['other']"),
    ("not = [toml", "trust file t.toml: not TOML"),
    ('[keys.alice]\npublic_key = "not base64!"\nroles = ["approver"]\n',
     "trust file t.toml: keys.alice.public_key: expected the base64 of an Ed25519 public key (NAME.pub), got "
     "'not base64!'"),
    ('[keys.alice]\npublic_key = "AAAA"\nroles = ["approver"]\n',  # valid base64, 3 bytes: no Ed25519 key
     "keys.alice.public_key: expected the base64 of an Ed25519 public key"),
    ('[keys.alice]\nroles = ["approver"]\n', "keys.alice.public_key: expected the base64"),
    (f'[keys.alice]\npublic_key = "{PUB["approver"]}"\nroles = ["approver", "admin"]\n',
     "trust file t.toml: keys.alice.roles: expected a non-empty list of publisher, approver, operator, policy, "
     "requester, got ['approver', 'admin']"),
    (f'[keys.alice]\npublic_key = "{PUB["approver"]}"\nroles = []\n', "keys.alice.roles: expected a non-empty list"),
    (f'[keys.alice]\npublic_key = "{PUB["approver"]}"\nroles = "approver"\n',
     "keys.alice.roles: expected a non-empty list"),
    (f'[keys.alice]\npublic_key = "{PUB["approver"]}"\n', "keys.alice.roles: expected a non-empty list"),
    (f'[keys.alice]\npublic_key = "{PUB["approver"]}"\nroles = ["approver"]\nexpires = 3\n',
     "trust file t.toml: keys.alice: expected public_key, roles and an optional until_offset, got"),
    (f'[keys.alice]\npublic_key = "{PUB["approver"]}"\nroles = ["approver"]\nuntil_offset = -1\n',
     "trust file t.toml: keys.alice.until_offset: expected a control-topic offset (an integer >= 0), got -1"),
    (f'[keys.alice]\npublic_key = "{PUB["approver"]}"\nroles = ["approver"]\nuntil_offset = 1.5\n',
     "keys.alice.until_offset: expected a control-topic offset (an integer >= 0), got 1.5"),
    (f'[keys.alice]\npublic_key = "{PUB["approver"]}"\nroles = ["approver"]\nuntil_offset = true\n',
     "keys.alice.until_offset: expected a control-topic offset (an integer >= 0), got True"),
    ('[keys]\nalice = "q1Yb"\n', "trust file t.toml: keys.alice: expected public_key, roles and an optional "
                                 "until_offset, got 'q1Yb'"),
])
def test_a_bad_trust_file_is_one_line_naming_the_key_and_the_field(text, message):
    with pytest.raises(TrustError) as caught:
        Trust.parse(text, "t.toml")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_second_bad_key_is_named_not_the_first_good_one():
    text = trust_text(good=entry("approver", ["approver"]), bad=entry("operator", ["root"]))
    with pytest.raises(TrustError, match=r"keys\.bad\.roles"):
        Trust.parse(text, "t.toml")


def test_a_missing_trust_file_is_one_line_naming_it(tmp_path):
    with pytest.raises(TrustError, match=f"pipeline.trust: cannot read the trust file '{tmp_path}/nope.toml'"):
        Trust.load(tmp_path / "nope.toml")
    assert not Trust.load(NONE).signed and Trust.load(NONE).fingerprint() == NONE


def test_a_trust_file_is_read_from_disk_and_fingerprinted_by_its_keys_not_its_layout(tmp_path):
    one = tmp_path / "one.toml"
    one.write_text(trust_text(a=entry("approver", ["approver"]), b=entry("operator", ["operator", "publisher"])))
    two = tmp_path / "two.toml"  # the same keys, other order, comments: the same trust
    two.write_text("# ops\n" + trust_text(b=entry("operator", ["publisher", "operator"]), a=entry("approver",
                                                                                                  ["approver"])))
    assert Trust.load(one).signed and Trust.load(one).fingerprint() == Trust.load(two).fingerprint()
    three = tmp_path / "three.toml"  # one more role: another trust
    three.write_text(trust_text(a=entry("approver", ["approver", "policy"]), b=entry("operator",
                                                                                      ["operator", "publisher"])))
    assert Trust.load(three).fingerprint() != Trust.load(one).fingerprint()


# --------------------------------------------------------------------------- signer_of


@pytest.mark.parametrize("action", sorted(ROLE_OF))
def test_each_action_needs_exactly_its_role(action):
    role = ROLE_OF[action]
    record = {**RECORD, "action": action}
    assert TRUST.signer_of(sign(record, role, KEYS[role]), role, 0) == role
    for other in ROLES:
        if other == role:
            continue
        with pytest.raises(TrustError, match=f"signed by '{other}', whose roles are {other}: .* needs the {role} "
                                             "role"):
            TRUST.signer_of(sign(record, other, KEYS[other]), role, 0)


@pytest.mark.parametrize("record, message", [
    (RECORD, "the record is not signed"),
    ({**RECORD, SIGNER: "publisher"}, "the record is not signed"),
    ({**RECORD, SIGNATURE: "AAAA"}, "the record is not signed"),
    (sign(RECORD, "mallory", generate_key()), "signed by 'mallory', a key this pipeline does not trust"),
    (sign(RECORD, "publisher", generate_key()), "the signature of 'publisher' does not match"),  # a name, not its key
    (sign(RECORD, "publisher", KEYS["approver"]), "the signature of 'publisher' does not match"),
    ({**sign(RECORD, "publisher", KEYS["publisher"]), SIGNATURE: "%%%"}, "not valid base64"),
    ({**sign(RECORD, "publisher", KEYS["publisher"]), SIGNER: ["publisher"]}, "the record is not signed"),
])
def test_an_unsigned_untrusted_or_forged_record_is_refused(record, message):
    with pytest.raises(TrustError, match=message):
        TRUST.signer_of(record, "publisher", 0)


def test_a_rotated_key_signs_below_its_offset_only():
    signed = sign(RECORD, "old", KEYS["old"])
    assert [TRUST.signer_of(signed, "publisher", offset) for offset in (0, 9)] == ["old", "old"]
    for offset in (10, 11, 10**9):
        with pytest.raises(TrustError, match=f"signed by 'old', a key rotated out at control offset 10: it signs "
                                             f"nothing at offset {offset}"):
            TRUST.signer_of(signed, "publisher", offset)
    with pytest.raises(TrustError, match="signs nothing off the control topic"):  # a re-fit request: no offset
        TRUST.signer_of(sign({"action": "request"}, "old", KEYS["old"]), "requester")


def test_a_key_with_several_roles_signs_each_of_them_and_nothing_else():
    assert {TRUST.signer_of(sign({**RECORD, "action": a}, "old", KEYS["old"]), ROLE_OF[a], 3)
            for a in ("publish", "approve", "rollback", "promote")} == {"old"}
    with pytest.raises(TrustError, match="needs the requester role"):
        TRUST.signer_of(sign({"action": "request"}, "old", KEYS["old"]), "requester", 3)


def test_the_claimed_signer_is_kept_short_and_only_if_it_is_text():
    assert claimed_signer({SIGNER: "x" * 500}) == "x" * 100
    assert claimed_signer({SIGNER: 7}) is None and claimed_signer(None) is None


# --------------------------------------------------------------------------- any change is caught

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**60, 2**60) | st.text(max_size=12)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6)


def _json_equal(a, b) -> bool:
    """Equal as JSON texts (True and 1, 1 and 1.0 are different JSON)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@settings(max_examples=200, deadline=None)
@given(field=st.sampled_from(sorted({*RECORD, SIGNER})), value=json_values, data=st.data())
def test_any_change_of_any_field_of_a_signed_record_is_refused(field, value, data):
    signed = sign(RECORD, "publisher", KEYS["publisher"])
    if _json_equal(signed[field], value):
        value = [value]  # a change, always
    changed = {**signed, field: value}
    with pytest.raises(TrustError):
        TRUST.signer_of(changed, "publisher", 0)
    removed = {name: v for name, v in signed.items() if name != field}
    with pytest.raises(TrustError):
        TRUST.signer_of(removed, "publisher", 0)
    extra = data.draw(st.text(min_size=1, max_size=8).filter(lambda name: name not in signed))
    with pytest.raises(TrustError):  # a field added
        TRUST.signer_of({**signed, extra: value}, "publisher", 0)


@settings(max_examples=100, deadline=None)
@given(order=st.permutations(sorted({*RECORD, SIGNER, SIGNATURE})), indent=st.sampled_from([None, 0, 2]),
       separators=st.sampled_from([(",", ":"), (", ", ": ")]), ascii_only=st.booleans())
def test_a_signature_verifies_whatever_the_order_and_spacing_of_the_json(order, indent, separators, ascii_only):
    signed = sign({**RECORD, "actor": "Chief Risk Officer (Zoë)"}, "publisher", KEYS["publisher"])
    text = json.dumps({name: signed[name] for name in order}, indent=indent, separators=separators,
                      ensure_ascii=ascii_only)
    assert TRUST.signer_of(json.loads(text), "publisher", 0) == "publisher"
