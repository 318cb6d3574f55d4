"""Run one DLedger member: `python -m dledger --group g --self-id n0 --peers 'n0-127.0.0.1:40911;...'
--store-dir /tmp/d`. Clients (DLedgerClient) append/get/metadata/transfer over the same TCP port.
SIGTERM/SIGINT stop it gracefully (pending appends answered, store flushed). `--state-machine
digest` runs the built-in `DigestStateMachine` over the committed log (shown in the metadata);
with `--enable-snapshot` it is snapshotted, and retention (`--file-reserved-hours`,
`--delete-when`) keeps the log after the newest snapshot."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from dledger.config import DLedgerConfig
from dledger.digest import DigestStateMachine
from dledger.server import DLedgerServer


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dledger", description=__doc__)
    p.add_argument("--group", required=True)
    p.add_argument("--self-id", required=True)
    p.add_argument("--peers", required=True, help="n0-host:port;n1-host:port;...")
    p.add_argument("--store-dir", required=True, help="storeBaseDir (dledger-{selfId} is created inside)")
    p.add_argument("--store-type", default="FILE", choices=("FILE", "MEMORY"))
    p.add_argument("--flush-disk-type", default="ASYNC_FLUSH", choices=("ASYNC_FLUSH", "SYNC_FLUSH"))
    p.add_argument("--preferred-leader-ids", default=None)
    p.add_argument("--data-file-size", type=int, default=None, help="mappedFileSizeForEntryData in bytes")
    p.add_argument("--max-pending-requests-num", type=int, default=None,
                   help="entries the leader holds uncommitted before LEADER_PENDING_FULL (10000)")
    p.add_argument("--state-machine", default="none", choices=("none", "digest"),
                   help="apply the committed log to a built-in state machine")
    p.add_argument("--enable-snapshot", action="store_true",
                   help="snapshot the state machine (enableSnapshot)")
    p.add_argument("--snapshot-threshold", type=int, default=None, help="applied entries between snapshots")
    p.add_argument("--file-reserved-hours", type=int, default=None, help="fileReservedHours (72)")
    p.add_argument("--delete-when", default=None, help="deleteWhen: hours of day retention runs, e.g. 04;16")
    p.add_argument("--peer-secret-file", default=None,
                   help="authenticate peer connections with the group's shared keys in this file (mode 600)")
    p.add_argument("--peer-tls-cert", default=None,
                   help="peer TLS: this member's PEM certificate (serverAuth and clientAuth), "
                        "with --peer-tls-key and --peer-tls-ca")
    p.add_argument("--peer-tls-key", default=None, help="peer TLS: the certificate's PEM key")
    p.add_argument("--peer-tls-ca", default=None,
                   help="peer TLS: the PEM CA every member's certificate chains to")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def build_config(args: argparse.Namespace) -> DLedgerConfig:
    cfg = DLedgerConfig(
        group=args.group,
        self_id=args.self_id,
        peers=args.peers,
        store_base_dir=args.store_dir,
        store_type=args.store_type,
        flush_disk_type=args.flush_disk_type,
        preferred_leader_ids=args.preferred_leader_ids,
        peer_secret_file=args.peer_secret_file,
        peer_tls_cert_file=args.peer_tls_cert,
        peer_tls_key_file=args.peer_tls_key,
        peer_tls_ca_file=args.peer_tls_ca,
        enable_snapshot=args.enable_snapshot,
    )
    if args.data_file_size:
        cfg.mapped_file_size_for_entry_data = args.data_file_size
    if args.max_pending_requests_num is not None:
        cfg.max_pending_requests_num = args.max_pending_requests_num
    if args.snapshot_threshold is not None:
        cfg.snapshot_threshold = args.snapshot_threshold
    if args.file_reserved_hours is not None:
        cfg.file_reserved_hours = args.file_reserved_hours
    if args.delete_when is not None:
        cfg.delete_when = args.delete_when
    cfg.validate()
    return cfg


async def serve(cfg: DLedgerConfig, state_machine: str) -> None:
    server = DLedgerServer(cfg)
    if state_machine == "digest":
        server.set_state_machine(DigestStateMachine())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    await stop.wait()
    await server.shutdown()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    try:
        cfg = build_config(args)
    except ValueError as exc:
        print(f"python -m dledger: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop

        uvloop.run(serve(cfg, args.state_machine))
    except ImportError:
        asyncio.run(serve(cfg, args.state_machine))
    return 0


if __name__ == "__main__":
    sys.exit(main())
