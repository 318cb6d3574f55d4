"""Options `token`, `caFile`, `clientCert`, `clientKey` of the Spark source and sink
(`pipeline/access.py`): what each mistake is told, and what a good set of options sends."""

from __future__ import annotations

import pickle

import pytest

from pipeline.access import Access
from tests.tls_certs import make_pki


def test_no_options_is_plain_http_without_a_token() -> None:
    access = Access.parse({}, "ledgermq")
    assert access == Access() and not access.tls
    assert access.headers() == {} and access.ssl_context() is None


def test_the_token_is_a_bearer_header_and_stays_out_of_the_repr() -> None:
    access = Access.parse({"token": "s3cret-token"}, "ledgermq")
    assert access.headers() == {"Authorization": "Bearer s3cret-token"}
    assert "s3cret" not in repr(access)
    assert pickle.loads(pickle.dumps(access)) == access  # it travels to the executors


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"clientKey": "k.pem"}, "option 'clientKey' needs option 'clientCert'"),
        ({"clientCert": "c.pem"}, "option 'clientCert' needs option 'caFile'"),
        ({"token": "a\r\nX-Evil: 1"}, "option 'token' must be one line"),
        ({"caFile": "/nonexistent/ca.pem"}, "ledgermq sink: option 'caFile' cannot be used"),
    ],
)
def test_each_mistake_names_its_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Access.parse(options, "ledgermq sink")


def test_a_ca_file_that_is_not_pem_and_a_client_key_that_does_not_match(tmp_path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ValueError, match="option 'caFile' cannot be used"):
        Access.parse({"caFile": str(junk)}, "ledgermq")
    pki = make_pki(tmp_path / "pki")
    wrong_key = {"caFile": str(pki.ca), "clientCert": str(pki.client_cert), "clientKey": str(pki.server_key)}
    with pytest.raises(ValueError, match="option 'clientCert' cannot be used"):
        Access.parse(wrong_key, "ledgermq")
    good = Access.parse({**wrong_key, "clientKey": str(pki.client_key)}, "ledgermq")
    assert good.tls and good.ssl_context() is not None
