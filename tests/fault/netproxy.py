"""Per-link TCP proxy for DLedger peer links, run as its own process by the fault harness.

Each *link* `src->dst` listens on a local port; member `src` is configured to reach member `dst`
through it (its `dLegerPeers` names the proxy port for `dst`). A link has two directions:
`forward` (bytes from the connecting member, `src`, to `dst`) and `backward` (`dst` to `src`).
Each direction is `pass` or `block`. A blocked direction discards bytes (a partition: nothing
arrives, nothing errors) and marks the connection poisoned; when the link is healed, poisoned
connections are closed so both sides reconnect with clean framing (what a real partition long
enough for TCP to give up looks like). New connections while blocked are accepted and then
swallow their bytes, like a SYN that is never answered. `reset` closes every connection now.

Control: one JSON object per line on the control port, one JSON reply line:
  {"cmd": "set", "link": "n0->n1", "forward": "block", "backward": "pass"}
  {"cmd": "heal"}                       every direction of every link back to pass
  {"cmd": "reset", "link": "n0->n1"}    close that link's connections
  {"cmd": "stats"}                      bytes passed/dropped per link (and dropped per direction)
Start: python -m tests.fault.netproxy --control-port P --link n0->n1=LISTEN:TARGET ...
Prints `READY` on stdout once every port listens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from dataclasses import dataclass, field

import uvloop

log = logging.getLogger("netproxy")
PASS, BLOCK = "pass", "block"
CHUNK = 64 * 1024


@dataclass(eq=False)  # identity-hashed: kept in a set per link
class Conn:
    """One proxied TCP connection (both halves)."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    poisoned: bool = False

    def close(self) -> None:
        for w in (self.client, self.upstream):
            if not w.is_closing():
                w.close()


@dataclass
class Link:
    """One directed link `src->dst` with its listening port and target."""

    name: str
    listen_port: int
    target_port: int
    forward: str = PASS
    backward: str = PASS
    conns: set[Conn] = field(default_factory=set)
    passed: int = 0
    dropped: int = 0
    dropped_by_direction: dict[str, int] = field(default_factory=lambda: {"forward": 0, "backward": 0})

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Accept a connection from `src`, connect to `dst`, pump both ways."""
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError as exc:
            log.info("link=%s event=connect_failed error=%s", self.name, exc)
            writer.close()
            return
        conn = Conn(writer, up_writer, poisoned=self.forward == BLOCK or self.backward == BLOCK)
        self.conns.add(conn)
        try:
            await asyncio.gather(self._pump(reader, up_writer, conn, "forward"),
                                 self._pump(up_reader, writer, conn, "backward"))
        finally:
            self.conns.discard(conn)
            conn.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: Conn,
                    direction: str) -> None:
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                if getattr(self, direction) == BLOCK:
                    self.dropped += len(data)
                    self.dropped_by_direction[direction] += len(data)
                    conn.poisoned = True
                    continue
                self.passed += len(data)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            conn.close()

    def set(self, forward: str | None, backward: str | None) -> None:
        """Change the directions; healing a link closes poisoned connections."""
        for value in (forward, backward):
            if value is not None and value not in (PASS, BLOCK):
                raise ValueError(f"direction state {value!r}: expected pass or block")
        if forward is not None:
            self.forward = forward
        if backward is not None:
            self.backward = backward
        if self.forward == BLOCK or self.backward == BLOCK:
            for c in self.conns:
                c.poisoned = True
        else:
            self.reset(only_poisoned=True)
        log.info("link=%s forward=%s backward=%s", self.name, self.forward, self.backward)

    def reset(self, only_poisoned: bool = False) -> int:
        """Close connections (all, or only those that lost bytes); returns how many."""
        victims = [c for c in self.conns if c.poisoned or not only_poisoned]
        for c in victims:
            c.close()
        return len(victims)


class Proxy:
    """All links of one harness plus the control server."""

    def __init__(self, links: list[Link]) -> None:
        self.links = {link.name: link for link in links}

    def command(self, msg: dict) -> dict:
        """Apply one control command; returns the reply object."""
        cmd = msg.get("cmd")
        if cmd == "set":
            link = self._link(msg)
            link.set(msg.get("forward"), msg.get("backward"))
            return {"ok": True}
        if cmd == "heal":
            for link in self.links.values():
                link.set(PASS, PASS)
            return {"ok": True}
        if cmd == "reset":
            return {"ok": True, "closed": self._link(msg).reset()}
        if cmd == "stats":
            return {"ok": True, "links": {n: {"forward": lk.forward, "backward": lk.backward,
                                              "passed": lk.passed, "dropped": lk.dropped,
                                              "dropped_forward": lk.dropped_by_direction["forward"],
                                              "dropped_backward": lk.dropped_by_direction["backward"],
                                              "conns": len(lk.conns)} for n, lk in self.links.items()}}
        raise ValueError(f"unknown command {cmd!r}")

    def _link(self, msg: dict) -> Link:
        name = msg.get("link")
        if name not in self.links:
            raise ValueError(f"unknown link {name!r}; have {sorted(self.links)}")
        return self.links[name]

    async def control(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve JSON-lines commands on one control connection."""
        try:
            while line := await reader.readline():
                try:
                    reply = self.command(json.loads(line))
                except (ValueError, TypeError, AttributeError) as exc:
                    reply = {"ok": False, "error": str(exc)}
                writer.write(json.dumps(reply).encode() + b"\n")
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()


def parse_link(spec: str) -> Link:
    """`n0->n1=LISTEN:TARGET` → Link."""
    name, _, ports = spec.partition("=")
    listen, _, target = ports.partition(":")
    if "->" not in name or not listen.isdigit() or not target.isdigit():
        raise argparse.ArgumentTypeError(f"bad link {spec!r}: expected src->dst=LISTEN_PORT:TARGET_PORT")
    return Link(name, int(listen), int(target))


async def serve(control_port: int, links: list[Link]) -> None:
    """Listen on every link port and the control port; run until killed."""
    proxy = Proxy(links)
    servers = [await asyncio.start_server(lk.handle, "127.0.0.1", lk.listen_port) for lk in links]
    servers.append(await asyncio.start_server(proxy.control, "127.0.0.1", control_port))
    sys.stdout.write("READY\n")
    sys.stdout.flush()
    await asyncio.gather(*(s.serve_forever() for s in servers))


def main(argv: list[str] | None = None) -> int:
    """Entry point (the harness starts it and kills it by PID)."""
    p = argparse.ArgumentParser(prog="netproxy")
    p.add_argument("--control-port", type=int, required=True)
    p.add_argument("--link", type=parse_link, action="append", default=[])
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    uvloop.run(serve(args.control_port, args.link))
    return 0


if __name__ == "__main__":
    sys.exit(main())
