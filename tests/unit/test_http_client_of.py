"""`broker.http.consumers.client_of`: who an HTTP client is, from its headers as ASGI hands them
over (each byte read as Latin-1)."""

from broker.http.consumers import client_of


def _asgi(value: str) -> str:
    """A header value as a server reads it off the wire: its UTF-8 bytes, decoded as Latin-1."""
    return value.encode("utf-8").decode("latin-1")


def test_a_utf8_client_id_is_shown_as_sent():
    c = client_of({"x-client-id": _asgi("producteur-é-生产者"), "x-client-type": "PRODUCER"}, ("10.0.0.1", 5))
    assert c.client_id == "producteur-é-生产者"


def test_a_client_id_that_is_not_utf8_keeps_its_latin1_reading():
    c = client_of({"x-client-id": b"caf\xe9".decode("latin-1")}, ("10.0.0.1", 5))
    assert c.client_id == "café"


def test_without_an_id_the_address_and_agent_name_the_client():
    c = client_of({"user-agent": "ledgermq-python/1.2.3 (CPython 3.11)"}, ("10.0.0.1", 5))
    assert c.client_id == "10.0.0.1 ledgermq-python/1.2.3 (CPython 3.11)"
    assert (c.language, c.version) == ("PYTHON", "1.2.3")
