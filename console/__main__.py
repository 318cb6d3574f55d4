"""`mqdashboard -n NAMESRV [--port 8080]`: serve the console until Ctrl-C / SIGTERM."""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn

from console.app import create_app

log = logging.getLogger("ledgermq.console")


def main(argv: list[str] | None = None) -> int:
    """Console entry point (`mqdashboard`)."""
    p = argparse.ArgumentParser(prog="mqdashboard", description=__doc__.splitlines()[0])
    p.add_argument("-n", "--namesrv", required=True, help="name server address(es), host:port[;host:port]")
    p.add_argument("--port", type=int, default=8080, help="HTTP port (default 8080)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    p.add_argument("--refresh-ms", type=int, default=1000, help="live pages re-read the cluster this often")
    args = p.parse_args(argv)
    if not 0 < args.port < 65536:
        p.error(f"--port: {args.port} is not a TCP port")
    if args.refresh_ms < 200:
        p.error(f"--refresh-ms: {args.refresh_ms} is below 200 ms (every view costs requests to each member)")
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    app = create_app(args.namesrv, refresh_ms=args.refresh_ms)
    print(f"LedgerMQ console: http://{args.host}:{args.port}/  (name server {args.namesrv})", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
