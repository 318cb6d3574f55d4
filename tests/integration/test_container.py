"""mqbrokercontainer hosting two brokers (plus one that cannot start) in one process."""

from __future__ import annotations

import asyncio
import signal

import httpx
import pytest

from broker.container import BrokerContainer, ContainerConfig
from tests.integration._ledgermq_procs import (
    CONF,
    ProcessGroup,
    free_port,
    start_namesrv,
    wait_http,
    write_conf,
)


@pytest.fixture
def container(tmp_path):
    group = ProcessGroup(tmp_path)
    try:
        ns = start_namesrv(group, tmp_path)
        ports = {}
        paths = []
        for name in ("broker-c1", "broker-c2"):
            ports[name] = free_port()
            paths.append(
                write_conf(
                    CONF / "container" / f"{name}.conf",
                    tmp_path / f"{name}.conf",
                    {
                        "listenPort": str(ports[name]),
                        "storePathRootDir": str(tmp_path / f"store-{name}"),
                        "grpcServerPort": "0",
                    },
                )
            )
        # A third broker whose port is the container's own: it must fail alone.
        cport = free_port()
        paths.append(
            write_conf(
                CONF / "container" / "broker-c1.conf",
                tmp_path / "broker-bad.conf",
                {
                    "brokerName": "broker-bad",
                    "listenPort": str(cport),
                    "storePathRootDir": str(tmp_path / "store-bad"),
                    "grpcServerPort": "0",
                },
            )
        )
        conf = write_conf(
            CONF / "container" / "broker-container.conf",
            tmp_path / "container.conf",
            {
                "listenHost": "127.0.0.1",
                "listenPort": str(cport),
                "namesrvAddr": ns,
                "brokerConfigPaths": ":".join(p.name for p in paths),
            },
        )
        proc = group.start("container", "broker.container", "-c", str(conf))
        wait_http(f"http://127.0.0.1:{cport}/health", proc=proc, timeout_s=20)
        yield {"group": group, "proc": proc, "ns": f"http://{ns}", "cport": cport, "ports": ports}
    finally:
        group.stop_all()


def test_container_hosts_two_brokers_and_isolates_a_failing_one(container):
    settled = wait_http(
        f"http://127.0.0.1:{container['cport']}/brokers",
        ok=lambda r: all(b["state"] not in ("NEW", "STARTING") for b in r.json()["brokers"]),
    )
    brokers = {b["brokerName"]: b for b in settled.json()["brokers"]}
    assert brokers["broker-c1"]["state"] == "RUNNING" and brokers["broker-c2"]["state"] == "RUNNING"
    assert brokers["broker-bad"]["state"] == "FAILED" and brokers["broker-bad"]["error"]
    for name, port in container["ports"].items():
        url = f"http://127.0.0.1:{port}"
        r = httpx.post(f"{url}/topics/t-{name}/messages", json={"messages": [{"body": name, "queueId": 0}]})
        assert r.status_code == 200, r.text
        got = httpx.get(f"{url}/topics/t-{name}/queues/0/messages", params={"offset": 0}).json()["messages"]
        assert [m["body"] for m in got] == [name]
        assert httpx.get(f"{url}/status").json()["brokerName"] == name
    # Each registers on its own: both sets appear in the name server's cluster view.
    view = wait_http(
        f"{container['ns']}/cluster", ok=lambda r: {"broker-c1", "broker-c2"} <= set(r.json()["brokers"])
    ).json()
    assert "broker-bad" not in view["brokers"]
    # Graceful shutdown of all: SIGTERM, exit status 0.
    container["proc"].send_signal(signal.SIGTERM)
    assert container["proc"].wait(15) == 0
    assert "event=container_stopped" in container["group"].log_text("container")


async def test_a_hosted_broker_whose_server_stops_is_reported_failed_and_the_other_keeps_serving(tmp_path):
    """In this process's loop: a real container with two real brokers; one broker's HTTP server
    is told to exit, as if it had died."""
    ports = {name: free_port() for name in ("broker-c1", "broker-c2")}
    paths = [
        str(
            write_conf(
                CONF / "container" / f"{name}.conf",
                tmp_path / f"{name}.conf",
                {
                    "listenPort": str(port),
                    "storePathRootDir": str(tmp_path / f"store-{name}"),
                    "namesrvAddr": "",
                    "grpcServerPort": "0",
                },
            )
        )
        for name, port in ports.items()
    ]
    container = BrokerContainer(
        ContainerConfig(listen_host="127.0.0.1", listen_port=free_port(), broker_config_paths=paths)
    )
    await container.start()
    try:
        c1, c2 = container.brokers
        assert (c1.state, c2.state) == ("RUNNING", "RUNNING")
        c1.runtime.request_stop()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{container.config.listen_port}") as http:
            for _ in range(200):
                rows = {b["brokerName"]: b for b in (await http.get("/brokers")).json()["brokers"]}
                if rows["broker-c1"]["state"] == "FAILED":
                    break
                await asyncio.sleep(0.05)
            assert rows["broker-c1"]["state"] == "FAILED" and "HTTP server" in rows["broker-c1"]["error"]
            assert rows["broker-c2"]["state"] == "RUNNING"
            assert (await http.get("/health")).json()["running"] == 1
        url = f"http://127.0.0.1:{ports['broker-c2']}/topics/still/messages"
        async with httpx.AsyncClient() as http:
            r = await http.post(url, json={"messages": [{"body": "ok"}]})
        assert r.status_code == 200, r.text
    finally:
        await container.stop()
    assert c2.state == "STOPPED"


# RocketMQ 5.3's distribution/conf/container/broker-container.conf, followed by every other key its
# BrokerContainerStartup applies from a container file (BrokerContainerConfig, NettyServerConfig,
# NettyClientConfig) at RocketMQ's defaults. Ports, paths and namesrvAddr are set by the test.
ROCKETMQ_53_CONTAINER_KEYS = """\
fetchNamesrvAddrByAddressServer=false
rocketmqHome=/opt/rocketmq
fetchNameSrvAddrByDnsLookup=false
brokerContainerIP=127.0.0.1
fetchNamesrvAddrInterval=10000
updateNamesrvAddrInterval=120000
configBlackList=configBlackList;brokerConfigPaths
bindAddress=127.0.0.1
serverWorkerThreads=8
serverCallbackExecutorThreads=0
serverSelectorThreads=3
serverOnewaySemaphoreValue=256
serverAsyncSemaphoreValue=64
serverChannelMaxIdleTimeSeconds=120
serverSocketSndBufSize=0
serverSocketRcvBufSize=0
writeBufferHighWaterMark=0
writeBufferLowWaterMark=0
serverSocketBacklog=1024
serverNettyWorkerGroupEnable=true
serverPooledByteBufAllocatorEnable=true
enableShutdownGracefully=false
shutdownWaitTimeSeconds=30
useEpollNativeSelector=false
clientWorkerThreads=4
clientCallbackExecutorThreads=2
clientOnewaySemaphoreValue=65535
clientAsyncSemaphoreValue=65535
connectTimeoutMillis=3000
channelNotActiveInterval=60000
scanAvailableNameSrv=true
clientChannelMaxIdleTimeSeconds=120
clientSocketSndBufSize=0
clientSocketRcvBufSize=0
clientPooledByteBufAllocatorEnable=false
clientCloseSocketIfTimeout=true
useTLS=false
socksProxyConfig={}
disableCallbackExecutor=false
disableNettyWorkerGroup=false
maxReconnectIntervalTimeSeconds=60
enableReconnectForGoAway=true
"""

# The keys of RocketMQ 5.3's broker-a-in-container1.conf (2container-2m-2s) LedgerMQ does not use.
ROCKETMQ_53_HOSTED_BROKER_KEYS = {
    "brokerRole": "SYNC_MASTER",
    "haListenPort": "10912",
    "totalReplicas": "2",
    "inSyncReplicas": "2",
    "minInSyncReplicas": "1",
    "enableAutoInSyncReplicas": "true",
    "slaveReadEnable": "true",
    "brokerHeartbeatInterval": "1000",
    "brokerNotActiveTimeoutMillis": "5000",
    "sendHeartbeatTimeoutMillis": "1000",
    "enableSlaveActingMaster": "true",
    "supportActingMaster": "true",
}


def test_the_container_starts_from_rocketmq_53_container_and_broker_files(tmp_path):
    group = ProcessGroup(tmp_path)
    try:
        ns = start_namesrv(group, tmp_path)
        bport, cport = free_port(), free_port()
        broker = write_conf(
            CONF / "container" / "broker-c1.conf",
            tmp_path / "broker-a-in-container1.conf",
            {
                "listenPort": str(bport),
                "storePathRootDir": str(tmp_path / "store"),
                "storePathCommitLog": str(tmp_path / "store" / "commitlog"),
                **ROCKETMQ_53_HOSTED_BROKER_KEYS,
            },
        )
        conf = tmp_path / "broker-container.conf"
        conf.write_text(
            f"listenPort={cport}\nnamesrvAddr={ns}\nbrokerConfigPaths={broker.name}\n"
            + ROCKETMQ_53_CONTAINER_KEYS
        )
        proc = group.start("container", "broker.container", "-c", str(conf))
        rows = wait_http(
            f"http://127.0.0.1:{cport}/brokers",
            proc=proc,
            timeout_s=20,
            ok=lambda r: r.status_code == 200 and r.json()["brokers"][0]["state"] == "RUNNING",
        ).json()["brokers"]
        assert rows[0]["brokerName"] == "broker-c1"
        r = httpx.post(f"http://127.0.0.1:{bport}/topics/t53/messages", json={"messages": [{"body": "x"}]})
        assert r.status_code == 200, r.text
        log = group.log_text("container")
        ignored = [line for line in log.splitlines() if "event=config_key_ignored" in line]
        for key in [line.partition("=")[0] for line in ROCKETMQ_53_CONTAINER_KEYS.splitlines()]:
            if key in ("bindAddress", "serverChannelMaxIdleTimeSeconds"):  # used, not ignored
                continue
            named = [line for line in ignored if f"key={key} " in line and "broker-container.conf" in line]
            assert len(named) == 1, (key, named)
        for key in ROCKETMQ_53_HOSTED_BROKER_KEYS:
            assert sum(f"key={key} " in line for line in ignored) == 1, key
        assert not any("key=bindAddress " in line for line in ignored)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        group.stop_all()
