"""How the source and the sink reach a secured cluster: options ``token``, ``caFile``,
``clientCert`` and ``clientKey``, the SDK's ``token``/``ca_file``/``client_cert`` under Spark's
option names.

- ``token``: the ACL bearer token (``aclEnable=true`` on the brokers) sent with every request.
  Spark's query plans do not show a Python data source's options, and this object's ``repr``
  leaves the token out.
- ``caFile``: a PEM CA bundle. With it, every name server and broker is spoken to over TLS and
  verified against it, ``host:port`` addresses included (as name servers hand them out), like the
  SDK's ``ca_file``. Without it, only ``https://`` addresses use TLS, against the system's CAs.
- ``clientCert`` (+ ``clientKey`` when the key is a separate file): the certificate shown to
  listeners with ``tls.server.need.client.auth``.

Paths are read on the driver when the options are parsed (a wrong one fails the query at once,
naming the option) and again on each executor, so they must exist there too (the same path on
every node, or a file shipped with ``--files``).

Plain picklable data: it travels to the executors inside the reader's and the sink's options.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

import httpx

from client.transport import tls_context


@dataclass(frozen=True)
class Access:
    """Credentials and TLS settings of one query (see the module docstring)."""

    token: str | None = field(default=None, repr=False)
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str], who: str) -> Access:
        """The options as an ``Access``; ValueError naming the option when one cannot be used."""
        access = cls(
            token=options.get("token") or None,
            ca_file=options.get("caFile") or None,
            client_cert=options.get("clientCert") or None,
            client_key=options.get("clientKey") or None,
        )
        if access.client_key and not access.client_cert:
            raise ValueError(f"{who}: option 'clientKey' needs option 'clientCert'")
        if access.client_cert and not access.ca_file:
            raise ValueError(f"{who}: option 'clientCert' needs option 'caFile' (the CA of the servers)")
        if access.token is not None and any(c in access.token for c in "\r\n"):
            raise ValueError(f"{who}: option 'token' must be one line")
        if access.ca_file:
            for name, check in (("caFile", cls(ca_file=access.ca_file)), ("clientCert", access)):
                try:
                    check.ssl_context()
                except (OSError, ssl.SSLError) as exc:
                    raise ValueError(f"{who}: option {name!r} cannot be used: {exc}") from None
        return access

    @property
    def tls(self) -> bool:
        """Every connection speaks TLS (a CA file was given)."""
        return self.ca_file is not None

    def headers(self) -> dict[str, str]:
        """What every request carries: the bearer token, when there is one."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context for ``caFile``/``clientCert``; None without a CA file."""
        cert: str | tuple[str, str] | None = self.client_cert
        if self.client_cert and self.client_key:
            cert = (self.client_cert, self.client_key)
        return tls_context(self.ca_file, cert)

    def http_client(self, timeout: float | httpx.Timeout) -> httpx.Client:
        """An httpx client that sends the token and, with a CA file, speaks TLS to every address."""
        ctx = self.ssl_context()
        if ctx is None:
            return httpx.Client(timeout=timeout, headers=self.headers())
        return httpx.Client(timeout=timeout, headers=self.headers(), transport=_TlsEverywhere(ctx))


class _TlsEverywhere(httpx.BaseTransport):
    """Sends ``http://host:port`` requests as ``https://host:port``: name servers hand out broker
    addresses without a scheme, and with a CA file every listener of the cluster serves TLS."""

    def __init__(self, ctx: ssl.SSLContext) -> None:
        self._inner = httpx.HTTPTransport(verify=ctx)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.scheme == "http":
            request.url = request.url.copy_with(scheme="https")
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()
