"""`mqnamesrv -c conf/namesrv.conf`: run a name server (uvicorn on uvloop + httptools)."""

from __future__ import annotations

import argparse
import logging
import sys

import uvloop

from listener.server import HttpListener
from namesrv.app import create_app
from namesrv.config import NamesrvConfig, read_properties

log = logging.getLogger("namesrv")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mqnamesrv", description="LedgerMQ name server")
    p.add_argument("-c", "--config", help="namesrv .properties file (listenPort, brokerExpiredMs, ...)")
    p.add_argument("-p", "--port", type=int, help="override listenPort")
    p.add_argument(
        "-D",
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (RocketMQ name), e.g. -D listenHost=0.0.0.0",
    )
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


def load_config(args: argparse.Namespace) -> NamesrvConfig:
    """The file of `-c`, then each `-D KEY=VALUE` over it, then `-p`; ValueError/OSError naming the
    bad key, value or file."""
    props = read_properties(args.config) if args.config else {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"-D {item!r}: expected KEY=VALUE")
        props[key.strip()] = value.strip()
    config = NamesrvConfig.from_properties(props, args.config or "<defaults>")
    if args.port is not None:
        config.listen_port = args.port
        config.validate("--port")
    return config


def main(argv: list[str] | None = None) -> int:
    """Console entry point."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # One line per request from our own httpx clients (registration, probes) is noise.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        config = load_config(args)
    except (OSError, ValueError) as exc:
        print(f"mqnamesrv: {exc}", file=sys.stderr)
        return 2
    return uvloop.run(serve(config))


if __name__ == "__main__":
    sys.exit(main())
