"""`mqdashboard -n NAMESRV [--port 8080]`: serve the console until Ctrl-C / SIGTERM.

HTTPS like every LedgerMQ port (`listener`): `--tls-cert`/`--tls-key` (the `tls.server.certPath` /
`keyPath` of the servers' files); `--ca-file` when the cluster itself serves HTTPS; the listener's
read deadlines and connection caps apply at their defaults."""

from __future__ import annotations

import argparse
import logging
import sys

import uvloop

from console.app import create_app
from listener.config import ListenerConfig, ListenerConfigError, apply_key
from listener.server import HttpListener

log = logging.getLogger("ledgermq.console")


def main(argv: list[str] | None = None) -> int:
    """Console entry point (`mqdashboard`)."""
    p = argparse.ArgumentParser(prog="mqdashboard", description=__doc__.splitlines()[0])
    p.add_argument("-n", "--namesrv", required=True, help="name server address(es), host:port[;host:port]")
    p.add_argument("--port", type=int, default=8080, help="HTTP port (default 8080)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--refresh-ms", type=int, default=1000, help="live pages re-read the cluster this often")
    p.add_argument("--tls-cert", help="PEM certificate chain: serve HTTPS (tls.server.certPath)")
    p.add_argument("--tls-key", help="its PEM private key (tls.server.keyPath)")
    p.add_argument("--ca-file", help="PEM CA of the name servers' and brokers' certificates (HTTPS cluster)")
    args = p.parse_args(argv)
    if not 0 < args.port < 65536:
        p.error(f"--port: {args.port} is not a TCP port")
    if args.refresh_ms < 200:
        p.error(f"--refresh-ms: {args.refresh_ms} is below 200 ms (every view costs requests to each member)")
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    listener_config = ListenerConfig()
    try:
        if args.tls_cert or args.tls_key:
            apply_key(listener_config, "tls.server.mode", "enforcing")
            apply_key(listener_config, "tls.server.certPath", args.tls_cert or "")
            apply_key(listener_config, "tls.server.keyPath", args.tls_key or "")
        listener_config.validate()
    except ListenerConfigError as exc:
        p.error(f"--tls-cert/--tls-key: {exc}")
    listener = HttpListener(
        create_app(args.namesrv, refresh_ms=args.refresh_ms, ca_file=args.ca_file),
        name=f"console@{args.host}:{args.port}",
        host=args.host,
        port=args.port,
        config=listener_config,
        lifespan="on",
        handle_signals=True,
    )
    where = f"{listener.scheme}://{args.host}:{args.port}/"
    print(f"LedgerMQ console: {where}  (name server {args.namesrv})", flush=True)
    return uvloop.run(_serve(listener))


async def _serve(listener: HttpListener) -> int:
    try:
        await listener.start()
    except (OSError, RuntimeError) as exc:
        log.error("event=console_start_failed error=%s", exc)
        return 1
    await listener.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
