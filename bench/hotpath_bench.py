"""The broker's HTTP hot path in one process, without sockets or load generators: CPU microseconds
per request for a produce of 100 x 1 KB, the same with SDK-shaped idempotency keys (a fresh run
of them a request, as `firstIdempotencyKey`: the key table fills as it does behind the SDK), a
pull of 256, and a group's receive of 32 with the ack of what it got (the path of `SimpleConsumer`
and `PushConsumer`), through the ASGI app (HotPath, the services, the codec) on a real local-mode
store in a temporary directory — or, with `--dledger`, a one-member DLedger group (the commit log
of a broker set: entries, the append hook, the packed dispatch).

What it isolates: the cost of the HTTP layer and the services above the store — the part a
refactor of broker/http or broker/service can change — with no network, client or replication
noise, and in CPU time, so it is comparable on a busy machine. Compare two commits back to back:

    git archive <old> | tar -x -C /tmp/old && cd /tmp/old && PYTHONPATH=. python bench/hotpath_bench.py
    PYTHONPATH=. .venv/bin/python bench/hotpath_bench.py [--requests 1500] [--rounds 3] [--dledger]

(`git archive` of this file into the old tree too: it builds the app the way each tree does.)
Prints one line per round and writes bench/results/hotpath_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import uvloop

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
Asgi = Callable[
    [dict[str, Any], Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]
]


def _scope(method: str, path: str, query: bytes = b"", headers: tuple = ()) -> dict[str, Any]:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": query,
        "headers": [(b"content-type", b"application/json"), *headers],
        "http_version": "1.1",
        "scheme": "http",
        "server": ("127.0.0.1", 1),
        "client": ("127.0.0.1", 2),
        "root_path": "",
    }


def _build_app(controller: Any) -> Asgi:
    """The app as this tree builds it: over the services when there are some."""
    from broker.http.app import create_app

    try:
        from broker.service import BrokerServices
    except ImportError:  # a tree from before the service layer
        return create_app(controller)
    return create_app(BrokerServices.create(controller))


def _config(tmp: str, dledger: bool) -> Any:
    from broker.config import BrokerConfig

    if not dledger:
        return BrokerConfig(store_path_root_dir=tmp, default_topic_queue_nums=1)
    with socket.socket() as s:  # the member's DLedger listener: a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return BrokerConfig(
        store_path_root_dir=tmp, default_topic_queue_nums=1, enable_dledger_commit_log=True,
        dledger_group="bench", dledger_peers=f"n0-127.0.0.1:{port}", dledger_self_id="n0",
    )


async def _round(requests: int, dledger: bool) -> dict[str, float]:
    from broker.controller import BrokerController

    with tempfile.TemporaryDirectory(prefix="hotpath-bench-") as tmp:
        controller = BrokerController(_config(tmp, dledger))
        app = _build_app(controller)
        await controller.start()
        deadline = time.monotonic() + 30
        while not controller.is_master:  # a one-member group elects itself
            if time.monotonic() > deadline:
                raise RuntimeError("the one-member DLedger group elected no master in 30 s")
            await asyncio.sleep(0.05)
        statuses: set[int] = set()

        async def send(msg: dict) -> None:
            if msg["type"] == "http.response.start":
                statuses.add(msg["status"])

        plain = orjson.dumps({"messages": [{"body": "x" * 1024} for _ in range(100)]})
        # What the SDK sends: the batch's queue on every message, and the batch's keys as one run
        # (its first: a random 64-bit producer prefix + a counter, 32 lower-case hex digits).
        keyed_part = b'{"body":"' + b"x" * 1024 + b'","queueId":0}'
        prefix = os.urandom(8).hex().encode()
        keys = itertools.count(0, 100)

        def keyed() -> bytes:
            return (b'{"messages":[' + b",".join([keyed_part] * 100) + b'],"firstIdempotencyKey":"%s%016x"}'
                    % (prefix, next(keys)))

        store = controller.store

        async def produce(path: str, body: bytes) -> float:
            """One produce; the CPU seconds the app spent on it, its dispatch into the consume
            queue included (the answer no longer waits for that: the next request would pay it)."""
            chunks = [{"type": "http.request", "body": body, "more_body": False}]

            async def receive() -> dict:
                return chunks.pop() if chunks else {"type": "http.disconnect"}

            scope = _scope("POST", path, headers=((b"content-length", b"%d" % len(body)),))
            t0 = time.process_time()
            await app(scope, receive, send)
            await store.reput.wait_dispatched(store.commit_log.max_offset)
            return time.process_time() - t0

        async def pull(offset: int) -> None:
            async def receive() -> dict:
                return {"type": "http.disconnect"}

            query = b"offset=%d&maxMessages=256" % offset
            await app(_scope("GET", "/topics/t/queues/0/messages", query), receive, send)

        async def post(path: str, doc: dict) -> bytes:
            """A POST through the app; the answer's body."""
            body = orjson.dumps(doc)
            chunks = [{"type": "http.request", "body": body, "more_body": False}]
            out: list[bytes] = []

            async def receive() -> dict:
                return chunks.pop() if chunks else {"type": "http.disconnect"}

            async def collect(msg: dict) -> None:
                await send(msg)
                if msg["type"] == "http.response.body":
                    out.append(msg.get("body", b""))

            scope = _scope("POST", path, headers=((b"content-length", b"%d" % len(body)),))
            await app(scope, receive, collect)
            return b"".join(out)

        async def receive_and_ack() -> int:
            """One receive of 32 for group g, then the ack of every handle it got."""
            answer = orjson.loads(await post(
                "/consumers/g/receive", {"topic": "t", "maxMessages": 32, "invisibleMs": 60_000, "waitMs": 0}
            ))
            if "messages" not in answer:
                raise RuntimeError(f"a receive was refused: {answer}")
            got = answer["messages"]
            handles = [m["receiptHandle"] for m in got]
            answer = orjson.loads(await post("/consumers/g/ack", {"topic": "t", "receiptHandles": handles}))
            if any(r["status"] != "OK" for r in answer["results"]):
                raise RuntimeError(f"an ack was refused: {answer}")
            return len(got)

        try:
            for _ in range(20):  # warm-up: topics auto-created, first files mapped
                await produce("/topics/t/messages", plain)
                await produce("/topics/k/messages", keyed())
            # Plain and keyed interleaved, so a change in the machine's load hits both alike.
            plain_s = keyed_s = 0.0
            for _ in range(requests):
                plain_s += await produce("/topics/t/messages", plain)
                keyed_s += await produce("/topics/k/messages", keyed())
            produce_us, keyed_us = plain_s / requests * 1e6, keyed_s / requests * 1e6
            stored = (requests + 20) * 100
            if store.max_offset("t", 0) != stored:
                raise RuntimeError(f"t/0 holds {store.max_offset('t', 0)} of {stored} messages")
            pulls = 0
            t0 = time.process_time()
            for offset in range(0, stored - 255, 256):
                await pull(offset)
                pulls += 1
            pull_us = (time.process_time() - t0) / pulls * 1e6
            received = 0
            t0 = time.process_time()
            for _ in range(min(requests, stored // 32)):
                received += await receive_and_ack()
            receive_us = (time.process_time() - t0) / received * 32 * 1e6
        finally:
            await controller.shutdown()
        if statuses != {200}:
            raise RuntimeError(f"unexpected answers: {sorted(statuses)}")
        return {
            "produce_batch100_cpu_us": produce_us,
            "produce_keyed_batch100_cpu_us": keyed_us,
            "keyed_vs_plain": keyed_us / produce_us,
            "pull256_cpu_us": pull_us,
            "receive32_ack_cpu_us": receive_us,
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1500, help="produce requests per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--dledger", action="store_true",
        help="a one-member DLedger group (the commit log of a broker set) instead of a local store",
    )
    args = ap.parse_args(argv)
    rounds = []
    for i in range(args.rounds):
        r = uvloop.run(_round(args.requests, args.dledger))
        rounds.append(r)
        print(f"round {i + 1}: " + "  ".join(f"{k} {v:.4g}" for k, v in r.items()), flush=True)
    report = {
        "config": vars(args),
        "rounds": rounds,
        "median": {k: round(statistics.median(r[k] for r in rounds), 2) for k in rounds[0]},
    }
    print("median: " + "  ".join(f"{k} {v}" for k, v in report["median"].items()))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "hotpath_bench.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
