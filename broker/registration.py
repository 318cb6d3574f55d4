"""`BrokerRegistrar`: registers a broker with every name server in `namesrvAddr`, every 30 s
(RocketMQ's registerNameServerPeriod) and at once when `kick()` is called — on a role change or a
topic change — so routes follow a failover without waiting for the next heartbeat. A beat that
did not reach every name server is tried again after 1 s, 2 s, 4 s … (at most the period): a
member cut off during a failover (whose entry the new master's replaced) is back in the cluster
view seconds after the network heals, not up to a whole period later."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import httpx
import orjson

from broker.service.state import BrokerState
from broker.topics import is_system_topic
from wire.regauth import load_secrets, sign

log = logging.getLogger(__name__)

REGISTER_INTERVAL_S = 30.0
RETRY_FIRST_S = 1.0


class BrokerRegistrar:
    """Heartbeats to the name servers. Caller: the broker process (start/kick/stop)."""

    def __init__(
        self, state: BrokerState, namesrv_addrs: list[str], interval_s: float = REGISTER_INTERVAL_S
    ) -> None:
        self.state = state
        # tls.enable: the name servers are reached over HTTPS, verified against tls.client.trustCertPath.
        self.tls = state.config.tls_client
        scheme = self.tls.scheme
        self.namesrv_urls = [a if a.startswith("http") else f"{scheme}://{a}" for a in namesrv_addrs]
        self.interval_s = interval_s
        # registrationSecretFile: every register/unregister is signed with its first secret.
        path = state.config.registration_secret_file
        self._secret = load_secrets(path)[0] if path else None
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._client: httpx.AsyncClient | None = None
        self.registrations = 0

    def payload(self) -> dict[str, Any]:
        """The registration body: identity, term and the user topics with their queues and perm
        (less what `brokerPermission` takes away)."""
        cfg = self.state.config
        topics = {
            name: {"readQueueNums": t.read_queue_nums, "writeQueueNums": t.write_queue_nums,
                   "perm": cfg.registered_perm(t.perm)}
            for name, t in self.state.store.topics.all().items()
            if not is_system_topic(name)
        }
        return {
            "clusterName": cfg.broker_cluster_name,
            "brokerName": cfg.broker_name,
            "brokerId": self.state.broker_id(),
            "brokerAddr": cfg.broker_addr,
            "term": self.state.term(),
            "topics": topics,
            **({"grpcAddr": cfg.grpc_addr} if cfg.grpc_server_port else {}),
        }

    def kick(self) -> None:
        """Register now (role or topic table changed)."""
        self._kick.set()

    def start(self) -> None:
        if not self.namesrv_urls:
            log.info(
                "event=registration_disabled broker=%s reason=no namesrvAddr", self.state.config.broker_name
            )
            return
        self._client = httpx.AsyncClient(timeout=3.0, verify=self.tls.ssl_context() or True)
        self._task = asyncio.get_running_loop().create_task(self._run(), name="namesrv-registration")

    async def _run(self) -> None:
        retry_s = RETRY_FIRST_S
        while True:
            self._kick.clear()
            if await self.register_all():
                wait_s, retry_s = self.interval_s, RETRY_FIRST_S
            else:
                wait_s, retry_s = min(retry_s, self.interval_s), min(retry_s * 2, self.interval_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), wait_s)

    async def register_all(self) -> bool:
        """Register with every name server; whether each one could be reached (a refusal, such as
        a bad signature, counts as reached: trying again sooner would not change it)."""
        body = orjson.dumps(self.payload())
        return all(await asyncio.gather(*(self._register(url, body) for url in self.namesrv_urls)))

    async def _register(self, url: str, body: bytes) -> bool:
        assert self._client is not None
        retries = 1
        while True:
            try:
                r = await self._client.post(
                    f"{url}/brokers/register", content=body, headers=self._headers("/brokers/register", body)
                )
            except httpx.TransportError as exc:
                if retries:
                    retries -= 1
                    # A kept-alive connection the name server closed as idle fails on reuse (a
                    # ReadError): a role change must not wait a whole period for the next beat.
                    # Once more, on a fresh connection.
                    continue
                # A name server being down is normal (they are independent); tried again soon.
                log.warning("event=register_failed namesrv=%s error=%r", url, exc)
                return False
            except httpx.HTTPError as exc:
                log.warning("event=register_failed namesrv=%s error=%r", url, exc)
                return False
            if r.status_code != 200:
                log.warning(
                    "event=register_refused namesrv=%s status=%d body=%s", url, r.status_code, r.text[:200]
                )
            else:
                self.registrations += 1
            return True

    def _headers(self, path: str, body: bytes) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if self._secret is not None:
            headers.update(sign(self._secret, "POST", path, body))
        return headers

    async def stop(self, unregister: bool = True) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._client is not None:
            if unregister:
                body = orjson.dumps({"brokerAddr": self.state.config.broker_addr})
                for url in self.namesrv_urls:
                    with contextlib.suppress(httpx.HTTPError):
                        headers = self._headers("/brokers/unregister", body)
                        await self._client.post(
                            f"{url}/brokers/unregister", content=body, headers=headers, timeout=1.0
                        )
            await self._client.aclose()
