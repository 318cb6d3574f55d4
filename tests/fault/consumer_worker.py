"""A consumer process for matrix row 12 (consumer crash mid-batch). The harness SIGKILLs it at
random moments and starts a new one; each incarnation writes its own JSON-lines history.

Loop, per queue in turn: read the group's committed offset from the master (`read_offset`),
fetch a batch from there (`poll`), "process" it (sleep: the window in which a kill loses the
batch's progress), commit next offset (`commit_offset`). At-least-once: a batch fetched but not
committed is fetched again by the next incarnation. Offsets committed by one worker only grow.

    python -m tests.fault.consumer_worker --members URL,URL,URL --group G --topic T --queues 4 \
        --history FILE --first-op-id N
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys

import httpx
import uvloop

from tests.fault.history import History


class Master:
    """Finds the member that accepts offset commits (follows 421 masterAddr, else rotates)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.i = 0

    @property
    def url(self) -> str:
        return self.urls[self.i % len(self.urls)]

    def redirect(self, master_addr: str | None) -> None:
        url = f"http://{master_addr}" if master_addr else None
        self.i = self.urls.index(url) if url in self.urls else self.i + 1


async def consume(args: argparse.Namespace) -> None:
    """Run until killed."""
    history = History(args.history, first_op_id=args.first_op_id)
    master = Master(args.members.split(","))
    rng = random.Random(args.first_op_id)
    process = f"consumer-{args.first_op_id}"
    async with httpx.AsyncClient(timeout=3.0) as http:
        while True:
            for q in range(args.queues):
                queue = f"{args.topic}/{q}"
                url = master.url
                inv = history.invoke("read_offset", process, {"group": args.group, "queue": queue}, node=url)
                try:
                    r = await http.get(f"{url}/consumers/{args.group}/offsets", params={"topic": args.topic})
                except httpx.HTTPError as exc:
                    history.info(inv, type(exc).__name__)
                    master.redirect(None)
                    continue
                if r.status_code != 200:
                    history.fail(inv, f"{r.status_code}")
                    master.redirect(r.json().get("masterAddr") if r.status_code == 421 else None)
                    continue
                offsets = {int(o["queueId"]): int(o["offset"]) for o in r.json().get("offsets", [])
                           if o.get("topic") == args.topic}
                committed = max(offsets.get(q, 0), 0)
                history.ok(inv, {"group": args.group, "queue": queue, "offset": committed})

                inv = history.invoke("poll", process, {"queue": queue, "offset": committed}, node=url)
                try:
                    r = await http.get(f"{url}/topics/{args.topic}/queues/{q}/messages",
                                       params={"offset": committed, "maxMessages": 16, "waitMs": 200})
                except httpx.HTTPError as exc:
                    history.info(inv, type(exc).__name__)
                    continue
                if r.status_code != 200:
                    history.fail(inv, f"{r.status_code}")
                    continue
                msgs = [[int(m["queueOffset"]), m["body"]] for m in r.json().get("messages", [])]
                history.ok(inv, {"queue": queue, "from": committed, "messages": msgs})
                if not msgs:
                    continue
                await asyncio.sleep(rng.uniform(0.01, 0.15))  # processing: a kill here loses the batch
                new = msgs[-1][0] + 1
                value = {"group": args.group, "queue": queue, "offset": new}
                inv = history.invoke("commit_offset", process, value, node=url)
                try:
                    r = await http.put(f"{url}/consumers/{args.group}/offsets",
                                       json={"topic": args.topic, "offsets": {str(q): new}})
                except httpx.HTTPError as exc:
                    history.info(inv, type(exc).__name__)
                    continue
                if r.status_code in (200, 204):
                    history.ok(inv, value)
                elif r.status_code >= 500:
                    history.info(inv, f"{r.status_code}")
                else:
                    history.fail(inv, f"{r.status_code}")
                    if r.status_code == 421:
                        master.redirect(r.json().get("masterAddr"))


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    p = argparse.ArgumentParser(prog="consumer_worker")
    p.add_argument("--members", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--history", required=True)
    p.add_argument("--first-op-id", type=int, default=0)
    args = p.parse_args(argv)
    uvloop.run(consume(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
