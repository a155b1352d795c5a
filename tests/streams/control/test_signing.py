"""Ed25519 signatures over a control record's canonical bytes, and named key pairs on disk (issue 33's primitive)."""

import os
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.streams.control.signing import (
    SIGNATURE,
    SIGNER,
    SignatureError,
    canonical_bytes,
    generate_key,
    public_key_text,
    read_private_key,
    sign,
    verify,
    write_key_pair,
)

KEY = generate_key()
TRUSTED = {"refit@vm": public_key_text(KEY)}
RECORD = {"kind": "plan", "version": 2, "sha256": "a" * 64, "action": "publish", "candidate": False,
          "reason": "Alertmanager: FairstreamFairnessDrift", "statistics": {"records": 1200.0}}

values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20)
                      | st.floats(allow_nan=False, allow_infinity=False),
                      lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                      max_leaves=8)


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=10).filter(lambda k: k not in (SIGNER, SIGNATURE)), values,
                       max_size=6))
def test_a_signed_record_verifies_whatever_its_key_order_and_any_change_is_caught(record):
    signed = sign(record, "refit@vm", KEY)
    assert verify(dict(reversed(list(signed.items()))), TRUSTED) == "refit@vm"  # the bytes, not the order
    changed = {**signed, "kind": "flow" if signed.get("kind") != "flow" else "plan"}
    with pytest.raises(SignatureError, match="does not match"):
        verify(changed, TRUSTED)


def test_the_signer_is_part_of_what_is_signed():
    signed = sign(RECORD, "refit@vm", KEY)
    other = generate_key()
    with pytest.raises(SignatureError, match="does not match"):  # a name swapped for another trusted name
        verify({**signed, SIGNER: "approver"}, {**TRUSTED, "approver": public_key_text(KEY)})
    with pytest.raises(SignatureError, match="does not match"):  # the right name, another key's signature
        verify(sign(RECORD, "refit@vm", other), TRUSTED)


@pytest.mark.parametrize("record, message", [
    (RECORD, "not signed"),
    ({**RECORD, SIGNER: "mallory", SIGNATURE: "AAAA"}, "does not trust"),
    ({**RECORD, SIGNER: "refit@vm", SIGNATURE: "not base64!"}, "not valid base64"),
])
def test_an_unsigned_unknown_or_garbled_record_is_refused_in_one_line(record, message):
    with pytest.raises(SignatureError, match=message) as info:
        verify(record, TRUSTED)
    assert "\n" not in str(info.value)


def test_canonical_bytes_leave_out_the_signature_only():
    signed = sign(RECORD, "refit@vm", KEY)
    assert canonical_bytes(signed) == canonical_bytes({**RECORD, SIGNER: "refit@vm"})
    assert b" " not in canonical_bytes({"a": [1, 2], "b": {"c": 1}})


def test_a_key_pair_is_written_once_its_private_half_for_its_owner_only(tmp_path):
    private, public = write_key_pair("approver-ada", tmp_path / "keys")
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    key = read_private_key(private)
    assert verify(sign(RECORD, "approver-ada", key), {"approver-ada": public.read_text().strip()}) == "approver-ada"
    with pytest.raises(FileExistsError):
        write_key_pair("approver-ada", tmp_path / "keys")
    with pytest.raises(ValueError, match="key name"):
        write_key_pair("../escape", tmp_path)


def test_keys_generate_writes_a_pair_and_refuses_to_overwrite_it(tmp_path, capsys):
    from fairstream.streams.cli import main

    assert main(["keys", "generate", "refit@vm", "--dir", str(tmp_path)]) == 0
    assert (tmp_path / "refit@vm.key").exists() and "trust file" in capsys.readouterr().out
    assert main(["keys", "generate", "refit@vm", "--dir", str(tmp_path)]) == 1
    assert "already exists" in capsys.readouterr().err
