"""`mqnamesrv -c conf/namesrv.conf`: run a name server (uvicorn on uvloop + httptools)."""

from __future__ import annotations

import argparse
import logging
import sys

import uvloop

from listener.server import HttpListener
from namesrv.app import create_app
from namesrv.config import NamesrvConfig

log = logging.getLogger("namesrv")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mqnamesrv", description="LedgerMQ name server")
    p.add_argument("-c", "--config", help="namesrv .properties file (listenPort, brokerExpiredMs, ...)")
    p.add_argument("-p", "--port", type=int, help="override listenPort")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


async def serve(config: NamesrvConfig) -> int:
    """Serve until SIGINT/SIGTERM (the listener installs the handlers); 1 if it cannot listen."""
    listener = HttpListener(
        create_app(config),
        name=f"namesrv@{config.listen_host}:{config.listen_port}",
        host=config.listen_host,
        port=config.listen_port,
        config=config.listener,
        lifespan="on",
        handle_signals=True,
    )
    try:
        await listener.start()
    except (OSError, RuntimeError) as exc:
        log.error("event=namesrv_start_failed error=%s", exc)
        return 1
    await listener.wait()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Console entry point."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # One line per request from our own httpx clients (registration, probes) is noise.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        config = NamesrvConfig.load(args.config) if args.config else NamesrvConfig()
        if args.port is not None:
            config.listen_port = args.port
            config.validate("--port")
    except (OSError, ValueError) as exc:
        print(f"mqnamesrv: {exc}", file=sys.stderr)
        return 2
    return uvloop.run(serve(config))


if __name__ == "__main__":
    sys.exit(main())
