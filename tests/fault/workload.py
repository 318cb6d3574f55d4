"""Workload clients for the fault suite, speaking the broker's HTTP API and recording every
operation in a `History`.

- `producer`: sends unique string bodies (one message per request, a random queue) to whoever is
  master, following `421 NOT_MASTER` hints and the harness monitor's view of the leader. Optional
  retries re-send the same value (with `idempotencyKey` when `idempotent=True`).
- `poller`: long-polls one queue from random members during the run (stale/aborted-read
  detection: everything read mid-run must agree with the final reads).
- `final_reads`: reads every queue from offset 0 on every live member, page by page.

Outcome rules are `history.classify_http_outcome`: a request that may have been sent and got no
answer is `info`, never `fail`.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

import httpx

from tests.fault.cluster import FaultCluster, Member
from tests.fault.history import FAIL, INFO, OK, History, classify_http_outcome

NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@dataclass
class WorkloadConfig:
    """Knobs of one run (kept small: 2 cores shared by the whole team)."""

    topic: str = "jepsen"
    queues: int = 4
    producers: int = 4
    pollers: int = 2
    interval_s: float = 0.02  # pause between one producer's requests
    timeout_s: float = 4.0  # client timeout; above maxWaitAckTimeMs so the broker's 504 comes first
    retries: int = 0
    idempotent: bool = False
    short_timeouts: bool = False  # row 16: random 5-300 ms timeouts force indeterminate outcomes
    poll_wait_ms: int = 300  # long-poll wait of the pollers


def _problem(r: httpx.Response) -> dict[str, Any] | None:
    try:
        body = r.json()
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


class Router:
    """Who to send a write to: a pinned member (a scenario forcing writes at one member), else the
    monitor's leader, else a 421 hint, else round robin."""

    def __init__(self, cluster: FaultCluster, pin: dict[str, Member | None] | None = None) -> None:
        self.cluster = cluster
        self.hint: Member | None = None
        self.pin = pin if pin is not None else {}
        self._rr = 0

    def target(self) -> Member:
        if self.pin.get("member") is not None:
            return self.pin["member"]
        leader, _ = self.cluster.current_leader()
        if leader is not None:
            return leader
        if self.hint is not None and self.hint.alive() and not self.hint.paused:
            return self.hint
        live = [m for m in self.cluster.members if m.alive()] or self.cluster.members
        self._rr += 1
        return live[self._rr % len(live)]

    def redirect(self, master_addr: str | None) -> None:
        self.hint = next((m for m in self.cluster.members if m.addr == master_addr), None)


async def ensure_topic(cluster: FaultCluster, topic: str, queues: int, timeout_s: float = 15.0) -> None:
    """Create the topic on the master (PUT is idempotent); retries across a leader change."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    last: object = None
    while asyncio.get_running_loop().time() < deadline:
        leader = await cluster.wait_leader()
        try:
            r = await cluster.http.put(f"{leader.url}/topics/{topic}", timeout=3.0, json={
                "readQueueNums": queues, "writeQueueNums": queues, "perm": 6})
            if r.status_code in (200, 201, 204):
                return
            last = f"{r.status_code} {r.text[:200]}"
        except httpx.HTTPError as exc:
            last = exc
        await asyncio.sleep(0.2)
    raise AssertionError(f"could not create topic {topic}: {last}")


async def send_one(cluster: FaultCluster, history: History, router: Router, process: str, value: str,
                   queue_id: int, cfg: WorkloadConfig, rng: random.Random) -> str:
    """One produce attempt, recorded; returns ok / fail / info."""
    target = router.target()
    msg: dict[str, Any] = {"body": value, "queueId": queue_id}
    if cfg.idempotent:
        msg["idempotencyKey"] = value
    timeout = rng.uniform(0.005, 0.3) if cfg.short_timeouts else cfg.timeout_s
    inv = history.invoke("send", process, value, node=target.name)
    try:
        r = await cluster.http.post(f"{target.url}/topics/{cfg.topic}/messages",
                                    json={"messages": [msg]}, timeout=timeout)
    except NOT_SENT as exc:
        history.fail(inv, f"not sent: {type(exc).__name__}")
        router.hint = None
        return FAIL
    except httpx.HTTPError as exc:
        history.info(inv, f"{type(exc).__name__} after sending")
        router.hint = None
        return INFO
    problem = None if r.status_code < 300 else _problem(r)
    kind = classify_http_outcome(r.status_code, problem, sent=True)
    if kind == OK:
        try:
            res = r.json()["results"][0]
            history.ok(inv, queue=f"{cfg.topic}/{res['queueId']}", offset=int(res["queueOffset"]))
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            # A 2xx we cannot parse still means the broker took it: ok, position unknown.
            history.ok(inv, unparsed=f"{exc}: {r.text[:200]}")
        return OK
    code = (problem or {}).get("code", str(r.status_code))
    if code == "NOT_MASTER":
        router.redirect((problem or {}).get("masterAddr"))
    if kind == FAIL:
        history.fail(inv, code, status=r.status_code)
    else:
        history.info(inv, code, status=r.status_code)
    return kind


async def producer(cluster: FaultCluster, history: History, worker: int, stop: asyncio.Event,
                   cfg: WorkloadConfig, run_id: str, rng: random.Random,
                   pin: dict[str, Member | None] | None = None) -> None:
    """Send unique values until `stop` is set."""
    router = Router(cluster, pin)
    seq = 0
    process = f"p{worker}"
    while not stop.is_set():
        value = f"{run_id}-{worker}-{seq}"
        seq += 1
        queue_id = rng.randrange(cfg.queues)
        for _attempt in range(cfg.retries + 1):
            kind = await send_one(cluster, history, router, process, value, queue_id, cfg, rng)
            if kind != INFO or stop.is_set():
                break
        await asyncio.sleep(cfg.interval_s if kind == OK else max(cfg.interval_s, 0.1))


async def poll_once(cluster: FaultCluster, history: History, member: Member, process: str, topic: str,
                    queue_id: int, offset: int, *, f: str = "poll", max_messages: int = 32,
                    wait_ms: int = 0, timeout_s: float = 3.0) -> dict[str, Any] | None:
    """One GET of a queue from one member, recorded; returns the response body on 200."""
    queue = f"{topic}/{queue_id}"
    inv = history.invoke(f, process, {"queue": queue, "offset": offset}, node=member.name)
    try:
        r = await cluster.http.get(
            f"{member.url}/topics/{topic}/queues/{queue_id}/messages",
            params={"offset": offset, "maxMessages": max_messages, "waitMs": wait_ms}, timeout=timeout_s)
    except httpx.HTTPError as exc:
        history.info(inv, type(exc).__name__)
        return None
    if r.status_code != 200:
        history.fail(inv, f"{r.status_code} {r.text[:120]}")
        return None
    body = r.json()
    msgs = [[int(m["queueOffset"]), m["body"]] for m in body.get("messages", [])]
    history.ok(inv, {"queue": queue, "from": offset, "messages": msgs,
                     "min_offset": body.get("minOffset", 0), "max_offset": body.get("maxOffset")})
    return body


async def poller(cluster: FaultCluster, history: History, worker: int, stop: asyncio.Event,
                 cfg: WorkloadConfig, rng: random.Random, wait_ms: int = 300) -> None:
    # A poll may legitimately take wait_ms plus a failover; the client timeout allows for both.
    """Long-poll queues from random live members, advancing per queue; reads are checked later."""
    next_offset = dict.fromkeys(range(cfg.queues), 0)
    process = f"c{worker}"
    while not stop.is_set():
        queue_id = rng.randrange(cfg.queues)
        live = [m for m in cluster.members if m.alive() and not m.paused]
        if not live:
            await asyncio.sleep(0.1)
            continue
        body = await poll_once(cluster, history, rng.choice(live), process, cfg.topic, queue_id,
                               next_offset[queue_id], wait_ms=wait_ms, timeout_s=wait_ms / 1000 + 3)
        if body and body.get("messages"):
            next_offset[queue_id] = int(body["messages"][-1]["queueOffset"]) + 1
        elif body is None:
            await asyncio.sleep(0.05)


async def final_reads(cluster: FaultCluster, history: History, cfg: WorkloadConfig,
                      members: list[Member] | None = None) -> dict[str, int]:
    """Read every queue from 0 to its max offset on every live member. Returns messages per member."""
    counts: dict[str, int] = {}
    for m in members or [m for m in cluster.members if m.alive() and not m.paused]:
        total = 0
        for q in range(cfg.queues):
            offset, stalls = 0, 0
            while stalls < 3:
                body = await poll_once(cluster, history, m, "reader", cfg.topic, q, offset, f="final_read",
                                       max_messages=256, timeout_s=10.0)
                if body is None:
                    stalls += 1
                    await asyncio.sleep(0.2)
                    continue
                msgs = body.get("messages", [])
                total += len(msgs)
                if msgs:
                    offset = int(msgs[-1]["queueOffset"]) + 1
                if not msgs or offset >= int(body.get("maxOffset", offset)):
                    break
        counts[m.name] = total
    return counts


class Workload:
    """Producers and pollers running as tasks until `stop()`."""

    def __init__(self, cluster: FaultCluster, history: History, cfg: WorkloadConfig | None = None,
                 seed: int = 0) -> None:
        self.cluster, self.history = cluster, history
        self.cfg = cfg or WorkloadConfig()
        self.rng = random.Random(seed)
        self.run_id = f"r{seed}"
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self.pin: dict[str, Member | None] = {"member": None}  # see `Router`

    async def start(self) -> None:
        await ensure_topic(self.cluster, self.cfg.topic, self.cfg.queues)
        for i in range(self.cfg.producers):
            rng = random.Random(self.rng.random())
            self._tasks.append(asyncio.create_task(
                producer(self.cluster, self.history, i, self._stop, self.cfg, self.run_id, rng, self.pin)))
        for i in range(self.cfg.pollers):
            rng = random.Random(self.rng.random())
            self._tasks.append(asyncio.create_task(
                poller(self.cluster, self.history, i, self._stop, self.cfg, rng, self.cfg.poll_wait_ms)))

    async def stop(self) -> None:
        """Stop and wait (bounded): in-flight requests finish or time out and are recorded."""
        self._stop.set()
        done, pending = await asyncio.wait(self._tasks, timeout=self.cfg.timeout_s + 2)
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for t in done:
            if t.exception() is not None:
                raise t.exception()
        mine = [f"p{i}" for i in range(self.cfg.producers)] + [f"c{i}" for i in range(self.cfg.pollers)]
        self.history.close_open_as_info("workload stopped with the request in flight", mine)
