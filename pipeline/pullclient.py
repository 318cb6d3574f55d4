"""A lean keep-alive HTTP/1.1 GET client for the executors' page pulls (stdlib ``http.client``).

Why not httpx here: a 1 MB binary page costs httpx ~3.2 ms of CPU on the client (its pure-Python
h11 parser hands the body over in small chunks) against ~0.7 ms for ``http.client``, which reads
the body with one buffered ``read``; at 1,000 messages a page that is ~2.5 µs of CPU per message,
about a tenth of the whole pipeline's CPU per row (docs/PERFORMANCE.md, Spark). Everything else in
the pipeline (routes, offsets, the sink) keeps httpx.
"""

from __future__ import annotations

import http.client
import ssl
from dataclasses import dataclass
from urllib.parse import urlencode, urlsplit

import httpx

# What a failed exchange raises: socket errors and timeouts (OSError) or a broken HTTP reply.
TRANSPORT_ERRORS = (OSError, http.client.HTTPException)


@dataclass
class PageResponse:
    """Status, headers (lower-case names) and the whole body of one answer."""

    status_code: int
    headers: dict[str, str]
    content: bytes

    def as_httpx(self) -> httpx.Response:
        """The same answer as an ``httpx.Response`` (for ``routes.problem_of`` on error answers)."""
        return httpx.Response(self.status_code, headers=self.headers, content=self.content)


class PageClient:
    """One keep-alive connection per base URL (``http://host:port`` or ``https://...``).

    Used from one thread at a time (the fetcher's single prefetch thread). A GET that fails on a
    reused connection is retried once on a fresh one, since the server may have closed an idle
    keep-alive connection between two pulls; a second failure is the caller's to handle.
    With ``ssl_context`` every base URL is spoken to over TLS (``http://`` ones too, as the SDK's
    ``ca_file`` does); ``headers`` go with every request.
    """

    def __init__(
        self, timeout_s: float = 30.0, *, ssl_context: ssl.SSLContext | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self._conns: dict[str, http.client.HTTPConnection] = {}
        self._tls = ssl_context
        self._tls_always = ssl_context is not None
        self._headers = headers or {}

    def _connect(self, base: str) -> http.client.HTTPConnection:
        u = urlsplit(base)
        if u.scheme == "https" or self._tls_always:
            if self._tls is None:
                self._tls = ssl.create_default_context()
            return http.client.HTTPSConnection(u.hostname, u.port, timeout=self.timeout_s, context=self._tls)
        return http.client.HTTPConnection(u.hostname, u.port, timeout=self.timeout_s)

    def get(self, base: str, path: str, params: dict, headers: dict[str, str]) -> PageResponse:
        """``GET base + path ? params``; raises one of ``TRANSPORT_ERRORS`` when it cannot be done."""
        target = f"{path}?{urlencode(params)}"
        for attempt in (0, 1):
            conn = self._conns.get(base)
            fresh = conn is None
            if conn is None:
                conn = self._conns[base] = self._connect(base)
            try:
                conn.request("GET", target, headers={**self._headers, **headers})
                resp = conn.getresponse()
                body = resp.read()
            except TRANSPORT_ERRORS:
                conn.close()
                self._conns.pop(base, None)
                if fresh or attempt:
                    raise
                continue  # a stale keep-alive connection: once more on a new one
            if resp.will_close:
                conn.close()
                self._conns.pop(base, None)
            return PageResponse(resp.status, {k.lower(): v for k, v in resp.getheaders()}, body)
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close every connection."""
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
