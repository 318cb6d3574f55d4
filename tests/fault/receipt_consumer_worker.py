"""A group consumer for matrix row 12 on the receipt API (`/consumers/{group}/receive|ack`), the
broker's shared-queue model: every consumer of a group receives from every queue. The harness
SIGKILLs it at random moments (often between receive and ack: the batch then turns visible again
after `invisibleMs`) and starts a new one; each incarnation writes its own JSON-lines history.

Loop: read the group's committed offsets (`read_offset`, one event per queue), `receive` a batch
(long poll), "process" it (sleep: the window in which a kill loses the batch), `ack` it. Event
values are the ones `checkers.receipts` reads.

    python -m tests.fault.receipt_consumer_worker --members URL,URL,URL --group G --topic T \
        --history FILE --first-op-id N [--invisible-ms 1500]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys

import httpx
import uvloop

from tests.fault.consumer_worker import Master
from tests.fault.history import History


async def _read_offsets(http: httpx.AsyncClient, master: Master, history: History, process: str,
                        args: argparse.Namespace) -> None:
    url = master.url
    invs = {q: history.invoke("read_offset", process, {"group": args.group, "queue": f"{args.topic}/{q}"},
                              node=url) for q in range(args.queues)}
    try:
        r = await http.get(f"{url}/consumers/{args.group}/offsets", params={"topic": args.topic})
    except httpx.HTTPError as exc:
        for inv in invs.values():
            history.info(inv, type(exc).__name__)
        master.redirect(None)
        return
    offsets = ({int(o["queueId"]): int(o["offset"]) for o in r.json().get("offsets", [])
                if o.get("topic") == args.topic} if r.status_code == 200 else {})
    for q, inv in invs.items():
        if q in offsets:
            history.ok(inv, {"group": args.group, "queue": f"{args.topic}/{q}", "offset": offsets[q]})
        else:
            history.fail(inv, f"{r.status_code}")
    if r.status_code == 421:
        master.redirect(r.json().get("masterAddr"))


async def consume(args: argparse.Namespace) -> None:
    """Run until killed."""
    history = History(args.history, first_op_id=args.first_op_id)
    master = Master(args.members.split(","))
    rng = random.Random(args.first_op_id)
    process = f"receipt-consumer-{args.first_op_id}"
    async with httpx.AsyncClient(timeout=5.0) as http:
        while True:
            await _read_offsets(http, master, history, process, args)
            url = master.url
            inv = history.invoke("receive", process, {"group": args.group, "topic": args.topic}, node=url)
            try:
                r = await http.post(f"{url}/consumers/{args.group}/receive",
                                    json={"topic": args.topic, "maxMessages": 8,
                                          "invisibleMs": args.invisible_ms, "waitMs": 300})
            except httpx.HTTPError as exc:
                history.info(inv, type(exc).__name__)  # may have been handed out: unknown
                master.redirect(None)
                continue
            if r.status_code != 200:
                (history.info if r.status_code >= 500 else history.fail)(inv, f"{r.status_code}")
                if r.status_code == 421:
                    master.redirect(r.json().get("masterAddr"))
                await asyncio.sleep(0.1)
                continue
            msgs = [[f"{args.topic}/{m['queueId']}", int(m["queueOffset"]), m["body"], m["receiptHandle"]]
                    for m in r.json().get("messages", [])]
            history.ok(inv, {"invisible_ms": args.invisible_ms, "messages": msgs})
            if not msgs:
                continue
            await asyncio.sleep(rng.uniform(0.05, 0.4))  # processing: a kill here loses the batch
            where = {h: (q, off) for q, off, _, h in msgs}
            inv = history.invoke("ack", process, {"group": args.group, "handles": list(where)}, node=url)
            try:
                r = await http.post(f"{url}/consumers/{args.group}/ack",
                                    json={"topic": args.topic, "receiptHandles": list(where)})
            except httpx.HTTPError as exc:
                history.info(inv, type(exc).__name__)
                continue
            if r.status_code == 200:
                results = [[*where[x["receiptHandle"]], x["receiptHandle"], x["status"]]
                           for x in r.json()["results"]]
                history.ok(inv, {"results": results})
            else:
                (history.info if r.status_code >= 500 else history.fail)(inv, f"{r.status_code}")
                if r.status_code == 421:
                    master.redirect(r.json().get("masterAddr"))


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    p = argparse.ArgumentParser(prog="receipt_consumer_worker")
    p.add_argument("--members", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--history", required=True)
    p.add_argument("--first-op-id", type=int, default=0)
    p.add_argument("--invisible-ms", type=int, default=1500)
    args = p.parse_args(argv)
    uvloop.run(consume(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
