"""In-memory network for tests: seeded drop / delay / duplicate / reorder / partition, and a
virtual-time event loop so whole DLedger groups run deterministically, much faster than real time.

Every message is encoded and decoded with the real frame codec on the way, so members never share
objects and the codec is exercised by every simulated step. Delivery order depends only on the
seeded RNG and the (virtual) clock, so a seed replays exactly.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import random
import selectors
from typing import Any

from dledger.codes import DLedgerException, DLedgerResponseCode
from dledger.rpc.protocol import (
    FRAME_HEAD,
    KIND_REQUEST,
    KIND_RESPONSE,
    RequestOrResponse,
    RpcService,
    decode_frame_body,
    dispatch,
    encode_frame,
    error_response,
    roundtrip,
)
from dledger.taskset import TaskSet

log = logging.getLogger("dledger.rpc.memory")


class _VirtualSelector(selectors.PollSelector):
    """A selector that never blocks: a wait of `timeout` seconds advances the loop's virtual clock.

    poll(), not select(): select() refuses descriptors past 1023, and a test process that opened
    many files before the simulator runs (an xdist worker) may hand the loop's self-pipe one of
    those."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if not ready and self.loop is not None:
            if timeout is None:
                raise RuntimeError("virtual loop deadlock: nothing scheduled and nothing ready")
            self.loop.vtime += timeout
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose `time()` is virtual: idle waits cost no wall time. Only for code that
    does no real I/O (the in-memory network and memory store)."""

    def __init__(self) -> None:
        self.vtime = 0.0
        selector = _VirtualSelector()
        super().__init__(selector)
        selector.loop = self

    def time(self) -> float:
        return self.vtime


class MemoryNetwork:
    """The wire between `MemoryRpcService`s. Fault knobs may be changed at any time."""

    def __init__(
        self, rng: random.Random, *, min_delay_s: float = 0.0005, max_delay_s: float = 0.003
    ) -> None:
        self.rng = rng
        self.min_delay_s = min_delay_s
        self.max_delay_s = max_delay_s
        self.drop_rate = 0.0
        self.dup_rate = 0.0
        self.services: dict[str, MemoryRpcService] = {}
        self.down: set[str] = set()
        self._partition: dict[str, int] | None = None
        self.delivered = 0
        self.dropped = 0
        # Request bytes put on the wire per (src, dst), delivered or not.
        self.sent_bytes: collections.Counter[tuple[str, str]] = collections.Counter()

    def partition(self, groups: list[list[str]]) -> None:
        """Only members in the same group can talk; members not listed are isolated."""
        self._partition = {m: i for i, g in enumerate(groups) for m in g}

    def heal(self) -> None:
        self._partition = None

    def can_talk(self, a: str, b: str) -> bool:
        if a in self.down or b in self.down:
            return False
        if self._partition is None:
            return True
        ga, gb = self._partition.get(a), self._partition.get(b)
        return ga is not None and ga == gb

    def _delay(self) -> float:
        return self.rng.uniform(self.min_delay_s, self.max_delay_s)

    def _lost(self) -> bool:
        return self.drop_rate > 0 and self.rng.random() < self.drop_rate

    def send(self, src: str, dst: str, req: RequestOrResponse, fut: asyncio.Future[Any]) -> None:
        """Deliver `req` to `dst` (maybe twice, maybe never) and route its response back to `fut`."""
        loop = asyncio.get_running_loop()
        copies = 2 if self.dup_rate > 0 and self.rng.random() < self.dup_rate else 1
        frame = encode_frame(KIND_REQUEST, 0, req)
        for _ in range(copies):
            self.sent_bytes[(src, dst)] += len(frame)  # what src put on the wire, delivered or not
            if not self.can_talk(src, dst) or self._lost():
                self.dropped += 1
                continue
            wire = decode_frame_body(KIND_REQUEST, req.request_code, memoryview(frame)[FRAME_HEAD.size:])
            loop.call_later(self._delay(), self._deliver, src, dst, wire, fut)

    def _deliver(self, src: str, dst: str, req: RequestOrResponse, fut: asyncio.Future[Any]) -> None:
        service = self.services.get(dst)
        if service is None or service.handler is None or not self.can_talk(src, dst):
            self.dropped += 1
            return
        self.delivered += 1
        task = asyncio.get_running_loop().create_task(service.serve(req))
        service.tasks.add(task)
        task.add_done_callback(lambda t: self._respond(src, dst, t, fut, service))

    def _respond(
        self, src: str, dst: str, task: asyncio.Task[Any], fut: asyncio.Future[Any], service: MemoryRpcService
    ) -> None:
        service.tasks.discard(task)
        if task.cancelled() or task.exception() is not None:
            return
        if not self.can_talk(dst, src) or self._lost():
            self.dropped += 1
            return
        wire = roundtrip(task.result(), KIND_RESPONSE)
        asyncio.get_running_loop().call_later(self._delay(), self._complete, src, wire, fut)

    def _complete(self, src: str, resp: RequestOrResponse, fut: asyncio.Future[Any]) -> None:
        if src in self.down or fut.done():
            return
        fut.set_result(resp)


class MemoryRpcService(RpcService):
    """One member's endpoint on a `MemoryNetwork`."""

    def __init__(self, network: MemoryNetwork, self_id: str) -> None:
        self.network = network
        self.self_id = self_id
        self.tasks = TaskSet()
        self._pending = TaskSet()
        network.services[self_id] = self

    async def serve(self, req: RequestOrResponse) -> RequestOrResponse:
        handler = self.handler
        if handler is None:  # shut down after the request was delivered: it is never answered
            raise DLedgerException(DLedgerResponseCode.NETWORK_ERROR, f"{self.self_id} is shut down")
        if req.remote_id != self.self_id:
            log.warning("refusing frame for member %s at %s", req.remote_id, self.self_id)
            return error_response(req, DLedgerResponseCode.UNKNOWN_MEMBER, self.self_id)
        return await dispatch(handler, req)

    async def call(self, peer_id: str, req: RequestOrResponse, timeout_s: float) -> Any:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.network.send(self.self_id, peer_id, req, fut)
        handle = loop.call_later(timeout_s, _expire, fut, peer_id)
        self._pending.add(fut)
        try:
            return await fut
        finally:
            handle.cancel()
            self._pending.discard(fut)

    async def shutdown(self) -> None:
        for t in list(self.tasks):
            t.cancel()
        for f in list(self._pending):
            if not f.done():
                f.set_exception(DLedgerException(DLedgerResponseCode.NETWORK_ERROR, "rpc service shut down"))
        self.handler = None


def _expire(fut: asyncio.Future[Any], peer_id: str) -> None:
    if not fut.done():
        fut.set_exception(DLedgerException(DLedgerResponseCode.TIMEOUT, f"no answer from {peer_id}"))
