"""`mqbroker -c broker.conf`: run one broker (store, DLedger member, HTTP API, registration)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

import uvloop

from broker.config import BrokerConfig, ConfigError, load_broker_config
from broker.runtime import BrokerRuntime, tune_gc

log = logging.getLogger("broker")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mqbroker", description="LedgerMQ broker")
    p.add_argument("-c", "--config", required=True, help="broker .properties file (RocketMQ key names)")
    p.add_argument(
        "-D",
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (RocketMQ name), e.g. -D listenPort=10921",
    )
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


async def run(config: BrokerConfig) -> int:
    """Start the broker, serve until SIGINT/SIGTERM, stop gracefully."""
    runtime = BrokerRuntime(config)
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()

    def on_signal(sig: signal.Signals) -> None:
        log.info("event=signal signal=%s broker=%s", sig.name, config.broker_name)
        stopping.set()
        runtime.request_stop()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await runtime.start()
    except Exception as exc:
        log.exception("event=broker_start_failed broker=%s", config.broker_name)
        print(f"mqbroker: {config.broker_name} failed to start: {exc}", file=sys.stderr)
        return 1
    tune_gc()
    if not stopping.is_set():
        # A signal during `start` reached front-ends not serving yet, whose `wait` then never
        # returns: `stopping` keeps it (a broker told to stop while starting hung until SIGKILL).
        served = asyncio.ensure_future(runtime.wait())
        signalled = asyncio.ensure_future(stopping.wait())
        await asyncio.wait((served, signalled), return_when=asyncio.FIRST_COMPLETED)
        served.cancel()
        signalled.cancel()
    await runtime.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    """Console entry point."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # One line per request from our own httpx clients (registration, probes) is noise.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"mqbroker: -D {item!r}: expected KEY=VALUE", file=sys.stderr)
            return 2
        overrides[key.strip()] = value.strip()
    try:
        config = load_broker_config(args.config, overrides)
    except (ConfigError, ValueError) as exc:
        print(f"mqbroker: {exc}", file=sys.stderr)
        return 2
    return uvloop.run(run(config))


if __name__ == "__main__":
    sys.exit(main())
