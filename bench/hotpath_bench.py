"""The broker's HTTP hot path in one process, without sockets or load generators: CPU microseconds
per request for a produce of 100 x 1 KB and a pull of 256, through the ASGI app (HotPath, the
services, the codec) on a real local-mode store in a temporary directory.

What it isolates: the cost of the HTTP layer and the services above the store — the part a
refactor of broker/http or broker/service can change — with no network, client or replication
noise, and in CPU time, so it is comparable on a busy machine. Compare two commits back to back:

    git archive <old> | tar -x -C /tmp/old && cd /tmp/old && PYTHONPATH=. python bench/hotpath_bench.py
    PYTHONPATH=. .venv/bin/python bench/hotpath_bench.py [--requests 1500] [--rounds 3]

(`git archive` of this file into the old tree too: it builds the app the way each tree does.)
Prints one line per round and writes bench/results/hotpath_bench.json.
"""

from __future__ import annotations

import argparse
import json
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


async def _round(requests: int) -> dict[str, float]:
    from broker.config import BrokerConfig
    from broker.controller import BrokerController

    with tempfile.TemporaryDirectory(prefix="hotpath-bench-") as tmp:
        controller = BrokerController(BrokerConfig(store_path_root_dir=tmp, default_topic_queue_nums=1))
        app = _build_app(controller)
        await controller.start()
        statuses: set[int] = set()

        async def send(msg: dict) -> None:
            if msg["type"] == "http.response.start":
                statuses.add(msg["status"])

        body = orjson.dumps({"messages": [{"body": "x" * 1024} for _ in range(100)]})
        produce_scope = _scope(
            "POST", "/topics/t/messages", headers=((b"content-length", b"%d" % len(body)),)
        )

        async def produce() -> None:
            chunks = [{"type": "http.request", "body": body, "more_body": False}]

            async def receive() -> dict:
                return chunks.pop() if chunks else {"type": "http.disconnect"}

            await app(dict(produce_scope), receive, send)

        async def pull(offset: int) -> None:
            async def receive() -> dict:
                return {"type": "http.disconnect"}

            query = b"offset=%d&maxMessages=256" % offset
            await app(_scope("GET", "/topics/t/queues/0/messages", query), receive, send)

        try:
            for _ in range(20):  # warm-up: topic auto-created, first files mapped
                await produce()
            t0 = time.process_time()
            for _ in range(requests):
                await produce()
            produce_us = (time.process_time() - t0) / requests * 1e6
            stored = (requests + 20) * 100
            pulls = 0
            t0 = time.process_time()
            for offset in range(0, stored - 255, 256):
                await pull(offset)
                pulls += 1
            pull_us = (time.process_time() - t0) / pulls * 1e6
        finally:
            await controller.shutdown()
        if statuses != {200}:
            raise RuntimeError(f"unexpected answers: {sorted(statuses)}")
        return {"produce_batch100_cpu_us": produce_us, "pull256_cpu_us": pull_us}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1500, help="produce requests per round")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    rounds = []
    for i in range(args.rounds):
        r = uvloop.run(_round(args.requests))
        rounds.append(r)
        print(f"round {i + 1}: " + "  ".join(f"{k} {v:.0f}" for k, v in r.items()), flush=True)
    report = {
        "config": vars(args),
        "rounds": rounds,
        "median": {k: round(statistics.median(r[k] for r in rounds)) for k in rounds[0]},
    }
    print("median: " + "  ".join(f"{k} {v}" for k, v in report["median"].items()))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "hotpath_bench.json").write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
