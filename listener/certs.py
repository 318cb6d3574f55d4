"""Certificates rotated without a restart: RocketMQ's brokers watch `tls.server.certPath`,
`tls.server.keyPath` and `tls.server.trustCertPath` (its `FileWatchService`) and reload their TLS
context when one changes; so do ours.

`TlsFiles` tells when the files changed (`FileVersions`: inode, mtime and size of each). A new
version is loaded into a scratch context first, so a certificate whose key has not been written
yet (cert and key are two files, rarely replaced at once) or a file that does not parse leaves the
certificate in force — logged once per version
(`event=tls_reload_failed`) and tried again when a file changes again — and a good one replaces it
for every new handshake (`event=tls_reloaded`); connections already open keep theirs.

Callers: `HttpListener` (every HTTP port: `CertReloader` loads the new chain into the running
`SSLContext`) and the broker's gRPC port (`broker/grpc/tls.py`, whose grpcio credentials ask
`TlsFiles.changed` on each handshake).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl

from listener.config import ListenerConfig, ListenerConfigError

log = logging.getLogger(__name__)

# How often the HTTP listeners look at their files (RocketMQ's FileWatchService: 500 ms).
CHECK_INTERVAL_S = 1.0

Version = tuple[tuple[int, int, int] | None, ...]


class FileVersions:
    """Which version of some files is in force: inode, mtime and size of each (an editor's rename
    and an in-place write both count; a missing file is a version too). A version that was tried
    and refused is remembered, so it is reported once and tried again only when a file changes.
    Callers: `TlsFiles`, the broker's ACL file (`broker/service/acl.py`)."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths
        self._accepted = self.current()
        self._refused: Version | None = None

    def current(self) -> Version:
        out = []
        for path in self.paths:
            try:
                st = os.stat(path)
            except OSError:
                out.append(None)
                continue
            out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        return tuple(out)

    def new_version(self) -> Version | None:
        """The files' version when it is neither the one in force nor one refused before."""
        version = self.current()
        return None if version in (self._accepted, self._refused) else version

    def accept(self, version: Version) -> None:
        self._accepted, self._refused = version, None

    def refuse(self, version: Version) -> None:
        self._refused = version


class TlsFiles:
    """A listener's certificate, key and trust files, and whether they changed since last accepted."""

    def __init__(self, name: str, config: ListenerConfig) -> None:
        self.name = name
        self.config = config
        paths = (config.cert_path, config.key_path, config.trust_cert_path)
        self.versions = FileVersions([p for p in paths if p])

    def changed(self) -> ssl.SSLContext | None:
        """A context built from the files when they changed and load (they are then the ones in
        force); None when nothing changed or the new version does not load (logged once)."""
        version = self.versions.new_version()
        if version is None:
            return None
        try:
            ctx = self.config.ssl_context()
        except ListenerConfigError as exc:
            self.versions.refuse(version)
            log.error("event=tls_reload_failed listener=%s key=%s error=%s keeping=the certificate in force",
                      self.name, exc.key, exc.reason)
            return None
        self.versions.accept(version)
        log.info("event=tls_reloaded listener=%s certPath=%s", self.name, self.config.cert_path)
        return ctx


class CertReloader:
    """Keeps a running server's `SSLContext` on the current files: new handshakes get a rotated
    certificate, trusted CAs added to `tls.server.trustCertPath` are trusted (a CA removed from it
    stays trusted until the restart: OpenSSL adds to a context's store, never removes)."""

    def __init__(self, name: str, config: ListenerConfig, ctx: ssl.SSLContext) -> None:
        self.files = TlsFiles(name, config)
        self.ctx = ctx
        self._task: asyncio.Task[None] | None = None

    def check(self) -> bool:
        """Load the files into the running context if they changed and load; True if it did."""
        if self.files.changed() is None:
            return False
        cfg = self.files.config
        self.ctx.load_cert_chain(cfg.cert_path, cfg.key_path, cfg.key_password or None)
        if cfg.trust_cert_path:
            self.ctx.load_verify_locations(cafile=cfg.trust_cert_path)
        return True

    def start(self, interval_s: float = CHECK_INTERVAL_S) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch(interval_s))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _watch(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.check()
            except (OSError, ssl.SSLError) as exc:  # replaced again between the check and the load
                log.warning("event=tls_reload_failed listener=%s error=%s", self.files.name, exc)
