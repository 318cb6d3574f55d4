"""wire.regauth: a registration signature covers method, path, date, nonce and body; stale,
replayed, tampered and unsigned requests are refused with their reason; secrets rotate; a secret
file readable by others, or too short, is refused."""

from __future__ import annotations

import os

import pytest

from wire.regauth import HEADER_DATE, HEADER_SIGNATURE, RegistrationVerifier, load_secrets, sign

OLD = b"o" * 32
NEW = b"n" * 64
BODY = b'{"brokerName":"broker-a","brokerAddr":"127.0.0.1:10911"}'


def test_signed_fresh_requests_pass_and_everything_else_has_a_reason():
    now = [1_700_000_000_000]
    v = RegistrationVerifier([NEW, OLD], clock_ms=lambda: now[0])
    ok = sign(OLD, "POST", "/brokers/register", BODY, now_ms=now[0])
    assert v.verify("POST", "/brokers/register", ok, BODY) is None  # the older secret still counts
    assert v.verify("POST", "/brokers/register", ok, BODY) == "replayed_nonce"
    assert v.verify("POST", "/brokers/register", {}, BODY) == "missing_signature"
    fresh = sign(NEW, "POST", "/brokers/register", BODY, now_ms=now[0])
    assert v.verify("POST", "/brokers/register", fresh, BODY.replace(b"a", b"b")) == "bad_signature"
    assert v.verify("POST", "/brokers/unregister", fresh, BODY) == "bad_signature"  # path is signed
    wrong = sign(b"x" * 32, "POST", "/brokers/register", BODY, now_ms=now[0])
    assert v.verify("POST", "/brokers/register", wrong, BODY) == "bad_signature"
    old = sign(NEW, "POST", "/brokers/register", BODY, now_ms=now[0] - 301_000)
    assert v.verify("POST", "/brokers/register", old, BODY) == "stale_date"
    bent = dict(fresh, **{HEADER_DATE: "soon"})
    assert v.verify("POST", "/brokers/register", bent, BODY) == "malformed_signature"
    assert v.verify("POST", "/brokers/register", dict(fresh, **{HEADER_SIGNATURE: "00"}), BODY) == (
        "malformed_signature"
    )
    assert v.verify("POST", "/brokers/register", fresh, BODY) is None


def test_nonces_are_forgotten_after_the_window_only():
    now = [0]
    v = RegistrationVerifier([NEW], max_skew_ms=1000, clock_ms=lambda: now[0])
    for i in range(100):
        now[0] = i * 100
        assert v.verify("POST", "/p", sign(NEW, "POST", "/p", b"", now_ms=now[0]), b"") is None
    assert len(v._seen) <= 21  # 2 x skew worth of nonces at one per 100 ms


def test_secret_files_are_checked(tmp_path):
    f = tmp_path / "secret"
    f.write_text("# registration secrets, newest first\n" + NEW.decode() + "\n" + OLD.decode() + "\n")
    os.chmod(f, 0o600)
    assert load_secrets(f) == [NEW, OLD]
    os.chmod(f, 0o640)
    with pytest.raises(ValueError, match="readable by group or others"):
        load_secrets(f)
    f.write_text("short\n")
    os.chmod(f, 0o600)
    with pytest.raises(ValueError, match="shorter than 32"):
        load_secrets(f)
    with pytest.raises(ValueError, match="cannot read"):
        load_secrets(tmp_path / "missing")
