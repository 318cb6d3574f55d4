"""Fixtures for the Spark tests: one local Spark session and real mqnamesrv/mqbroker processes.

The session is shared by the whole run (starting a JVM costs ~5 s); brokers are real processes
started from conf/ files with free ports, killed by PID at teardown. Each test uses its own topic
and its own tmp directories, so tests do not see each other's data.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from tests.integration._ledgermq_procs import CONF, ProcessGroup, free_port, wait_http, write_conf
from tests.spark.helpers import Cluster

LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = STDERR
appender.console.type = Console
appender.console.name = STDERR
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
# Failed tasks are expected in some tests; their stack traces are asserted through the query exception.
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = off
logger.tsm.name = org.apache.spark.scheduler.TaskSetManager
logger.tsm.level = off
logger.mbe.name = org.apache.spark.sql.execution.streaming
logger.mbe.level = off
logger.v2.name = org.apache.spark.sql.execution.datasources.v2
logger.v2.level = off
logger.utils.name = org.apache.spark.util.Utils
logger.utils.level = off
logger.py.name = org.apache.spark.api.python
logger.py.level = off
"""


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """A session-wide local[2] SparkSession (UI off, 2 shuffle partitions, quiet JVM) with ``ledgermq``."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import pipeline

    log4j = tmp_path_factory.mktemp("spark") / "log4j2.properties"
    log4j.write_text(LOG4J2)
    java_opts = f"-Dlog4j2.configurationFile=file:{log4j}"
    session = (
        SparkSession.builder.master("local[2]")
        .appName("ledgermq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .config("spark.driver.extraJavaOptions", java_opts)
        .config("spark.executor.extraJavaOptions", java_opts)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    pipeline.register(session)
    yield session
    session.stop()


def _start_namesrv(procs: ProcessGroup, tmp: Path) -> str:
    port = free_port()
    conf = write_conf(CONF / "namesrv.conf", tmp / "namesrv.conf", {"listenPort": str(port)})
    proc = procs.start("namesrv", "namesrv", "-c", str(conf))
    wait_http(f"http://127.0.0.1:{port}/cluster", proc=proc)
    return f"127.0.0.1:{port}"


def _broker_conf(tmp: Path, name: str, namesrv: str, overrides: dict[str, str | None]) -> Path:
    base = {
        "brokerClusterName": "SparkCluster",
        "brokerIP1": "127.0.0.1",
        "namesrvAddr": namesrv,
        "autoCreateTopicEnable": "true",
        "defaultTopicQueueNums": "4",
        "flushDiskType": "ASYNC_FLUSH",
        "slaveReadEnable": "true",
        "grpcServerPort": "0",
    }
    return write_conf(CONF / "dledger" / "broker-n0.conf", tmp / f"{name}.conf", base | overrides)


def _wait_registered(namesrv: str, broker_name: str, members: int, timeout_s: float = 30.0) -> None:
    def ok(r) -> bool:
        info = r.json().get("brokers", {}).get(broker_name)
        return r.status_code == 200 and info is not None and len(info.get("addrs", {})) >= members

    wait_http(f"http://{namesrv}/cluster", timeout_s=timeout_s, ok=ok)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """A name server and one single-node broker (``broker-s``, local commit log), for the whole run."""
    tmp = tmp_path_factory.mktemp("cluster")
    procs = ProcessGroup(tmp)
    try:
        namesrv = _start_namesrv(procs, tmp)
        port = free_port()
        conf = _broker_conf(
            tmp,
            "broker-s",
            namesrv,
            {
                "brokerName": "broker-s",
                "brokerId": "0",
                "listenPort": str(port),
                "grpcServerPort": str(free_port()),  # tests/spark/test_grpc_spark.py
                "storePathRootDir": str(tmp / "store-s"),
                "enableDLegerCommitLog": "false",
                "dLegerGroup": None,
                "dLegerPeers": None,
                "dLegerSelfId": None,
            },
        )
        proc = procs.start("broker-s", "broker", "-c", str(conf))
        wait_http(f"http://127.0.0.1:{port}/health", timeout_s=30, proc=proc)
        _wait_registered(namesrv, "broker-s", 1)
        yield Cluster(namesrv=namesrv, brokers=[f"127.0.0.1:{port}"], procs=procs, tmp=tmp)
    finally:
        procs.stop_all()


@pytest.fixture
def dledger_cluster(tmp_path):
    """A name server and a 3-member DLedger broker set ``broker-f`` (one test's worth; destructive)."""
    procs = ProcessGroup(tmp_path)
    try:
        namesrv = _start_namesrv(procs, tmp_path)
        http_ports = [free_port() for _ in range(3)]
        peer_ports = [free_port() for _ in range(3)]
        peers = ";".join(f"n{i}-127.0.0.1:{peer_ports[i]}" for i in range(3))
        addrs = []
        for i in range(3):
            conf = _broker_conf(
                tmp_path,
                f"n{i}",
                namesrv,
                {
                    "brokerName": "broker-f",
                    "brokerId": str(i),
                    "listenPort": str(http_ports[i]),
                    "storePathRootDir": str(tmp_path / f"store-n{i}"),
                    "enableDLegerCommitLog": "true",
                    "dLegerGroup": "broker-f",
                    "dLegerPeers": peers,
                    "dLegerSelfId": f"n{i}",
                },
            )
            procs.start(f"n{i}", "broker", "-c", str(conf))
            addrs.append(f"127.0.0.1:{http_ports[i]}")
        for i, addr in enumerate(addrs):
            wait_http(f"http://{addr}/health", timeout_s=30, proc=procs.procs[f"n{i}"])
        c = Cluster(namesrv=namesrv, brokers=addrs, procs=procs, tmp=tmp_path)
        c.wait_master(timeout_s=30)
        _wait_registered(namesrv, "broker-f", 3)
        yield c
    finally:
        procs.stop_all()


@pytest.fixture
def topic_name(request) -> str:
    """A topic name unique to the test."""
    name = request.node.name.replace("[", "_").replace("]", "")[:40]
    return f"spark_{name}_{int(time.time() * 1000) % 100000}"


@pytest.fixture
def retention_cluster(cluster, tmp_path):
    """An extra broker ``broker-r`` (same name server): 64 KB commit-log files, retention due every hour
    and checked every 500 ms."""
    procs = ProcessGroup(tmp_path)
    try:
        port = free_port()
        conf = _broker_conf(
            tmp_path,
            "broker-r",
            cluster.namesrv,
            {
                "brokerName": "broker-r",
                "brokerId": "0",
                "listenPort": str(port),
                "storePathRootDir": str(tmp_path / "store-r"),
                "enableDLegerCommitLog": "false",
                "dLegerGroup": None,
                "dLegerPeers": None,
                "dLegerSelfId": None,
                "mappedFileSizeCommitLog": str(64 * 1024),
                "deleteWhen": ";".join(f"{h:02d}" for h in range(24)),
                "fileReservedTime": "1",
                "cleanResourceInterval": "500",  # ms: a test waits for a pass, not 10 s
            },
        )
        proc = procs.start("broker-r", "broker", "-c", str(conf))
        wait_http(f"http://127.0.0.1:{port}/health", timeout_s=30, proc=proc)
        _wait_registered(cluster.namesrv, "broker-r", 1)
        yield Cluster(namesrv=cluster.namesrv, brokers=[f"127.0.0.1:{port}"], procs=procs, tmp=tmp_path)
    finally:
        procs.stop_all()
