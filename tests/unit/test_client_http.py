"""The SDK's HTTP/1.1 client (client/http.py) against real sockets: keep-alive reuse, the cap on
connections per origin with callers queued, chunked and Connection: close answers, a stale idle
connection never reused, query parameters, and the phase a failure is reported in."""

from __future__ import annotations

import asyncio

import pytest

from client.http import HttpClient, HttpTransportError, LateAnswer
from client.outcome import RequestPhase
from tests.ports import free_port


class Server:
    """Answers every request after `delay_s` with `answer(path)` (bytes of a whole response);
    counts connections and requests, and the most requests in progress at once."""

    def __init__(self, answer, delay_s: float = 0.0, idle_close_s: float | None = None) -> None:
        self.answer, self.delay_s, self.idle_close_s = answer, delay_s, idle_close_s
        self.connections = self.requests = self.busy = self.most_busy = 0
        self.paths: list[str] = []
        self.received = asyncio.Condition()  # notified at each request read

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        await self.server.wait_closed()

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                if self.idle_close_s is not None and self.requests:
                    try:
                        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.idle_close_s)
                    except TimeoutError:
                        break  # idle too long: close, as a keep-alive timeout does
                else:
                    head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                length = next(
                    (int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length")), 0
                )
                await reader.readexactly(length)
                self.requests += 1
                async with self.received:
                    self.received.notify_all()
                self.busy += 1
                self.most_busy = max(self.most_busy, self.busy)
                path = lines[0].split(" ")[1]
                self.paths.append(path)
                await asyncio.sleep(self.delay_s)
                self.busy -= 1
                data = self.answer(path)
                writer.write(data)
                await writer.drain()
                if b"Connection: close" in data:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def until_received(srv: Server, n: int) -> None:
    """Until the server has read `n` requests: written, not answered yet (a fixed sleep was not
    always long enough in a full unit run)."""
    async with srv.received:
        await asyncio.wait_for(srv.received.wait_for(lambda: srv.requests >= n), 5)


def ok(body: bytes = b"{}") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


async def test_sequential_requests_reuse_one_connection_and_carry_query_parameters():
    srv = Server(lambda p: ok(b'{"x": 1}'))
    async with srv as url:
        c = HttpClient()
        try:
            for i in range(5):
                r = await c.request("GET", f"{url}/a", params={"offset": i, "topic": "%DLQ%g"})
                assert (r.status, r.body, r.content_type) == (200, b'{"x": 1}', "application/json")
        finally:
            await c.aclose()
    assert srv.connections == 1 and srv.requests == 5
    assert srv.paths[3] == "/a?offset=3&topic=%25DLQ%25g"


async def test_at_most_max_connections_per_origin_the_other_callers_wait_their_turn():
    srv = Server(lambda p: ok(), delay_s=0.05)
    async with srv as url:
        c = HttpClient(max_connections=2)
        try:
            answers = await asyncio.gather(*(c.request("POST", url + "/p", body=b"x" * 10) for _ in range(7)))
        finally:
            await c.aclose()
    assert all(a.status == 200 for a in answers)
    assert srv.connections == 2 and srv.most_busy == 2 and srv.requests == 7


async def test_chunked_and_connection_close_answers():
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    closing = b"HTTP/1.1 503 Busy\r\nContent-Length: 2\r\nConnection: close\r\n\r\nno"
    srv = Server(lambda p: chunked if p == "/chunked" else closing)
    async with srv as url:
        c = HttpClient()
        try:
            assert (await c.request("GET", url + "/chunked")).body == b"abcde"
            r = await c.request("GET", url + "/close")
            assert (r.status, r.body) == (503, b"no")
            assert (await c.request("GET", url + "/chunked")).body == b"abcde"  # a new connection
        finally:
            await c.aclose()
    assert srv.connections == 2


async def test_a_connection_the_server_closed_while_idle_is_not_reused():
    """As uvicorn does past its keep-alive timeout: the next request goes on a new connection
    instead of failing (a request written into a closing connection has an unknown outcome)."""
    srv = Server(lambda p: ok(), idle_close_s=0.05)
    async with srv as url:
        c = HttpClient()
        try:
            await c.request("GET", url + "/1")
            await asyncio.sleep(0.3)  # the server has closed it by now
            r = await c.request("POST", url + "/2", body=b"x")
        finally:
            await c.aclose()
    assert r.status == 200 and srv.connections == 2 and srv.requests == 2


async def test_failures_name_their_phase():
    c = HttpClient(connect_timeout_s=1.0)
    try:
        with pytest.raises(HttpTransportError) as info:
            await c.request("GET", f"http://127.0.0.1:{free_port()}/x")
        assert info.value.phase is RequestPhase.CONNECT
        with pytest.raises(HttpTransportError) as info:
            await c.request("GET", "ftp://127.0.0.1:1/x")
        assert info.value.phase is RequestPhase.CONNECT
        srv = Server(lambda p: ok(), delay_s=1.0)
        async with srv as url:
            with pytest.raises(HttpTransportError) as info:
                await c.request("GET", url + "/slow", timeout_s=0.2)
        assert info.value.phase is RequestPhase.AWAIT
    finally:
        await c.aclose()


async def test_a_cancelled_request_with_keep_late_is_read_to_its_end_then_its_connection_closed():
    srv = Server(lambda p: ok(b'{"late": true}'), delay_s=0.2)
    async with srv as url:
        c = HttpClient()
        kept: list[LateAnswer] = []
        try:
            task = asyncio.ensure_future(c.request("POST", f"{url}/receive", keep_late=kept.append))
            await until_received(srv, 1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert len(kept) == 1
            resp = await asyncio.wait_for(kept[0].answer, 2)  # the answer still arrives
            assert resp.status == 200 and resp.body == b'{"late": true}'
            # That connection carried only the late answer; the next request opens another.
            assert (await c.request("GET", f"{url}/next")).status == 200
            assert srv.connections == 2
        finally:
            await c.aclose()


async def test_a_cancelled_request_is_hung_up_on_unless_it_keeps_its_late_answer():
    srv = Server(lambda p: ok(), delay_s=5.0)
    async with srv as url:
        c = HttpClient()
        kept: list[LateAnswer] = []
        try:
            plain = asyncio.ensure_future(c.request("POST", f"{url}/receive", body=b"{}"))
            late = asyncio.ensure_future(c.request("POST", f"{url}/receive", keep_late=kept.append))
            await until_received(srv, 2)
            plain.cancel()
            late.cancel()
            await asyncio.gather(plain, late, return_exceptions=True)
            assert len(kept) == 1 and not kept[0].answer.done()
            kept[0].abort()  # the caller gives up on it: the answer ends as a transport failure
            with pytest.raises(HttpTransportError):
                await asyncio.wait_for(kept[0].answer, 2)
        finally:
            await c.aclose()
