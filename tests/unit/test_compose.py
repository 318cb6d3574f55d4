"""docker-compose.yml describes `make run`'s topology on separate hosts: a name server, the
3-member set broker-a and the console, one service per process, a volume per broker, and broker
overrides that load (the same loader as `mqbroker -c ... -D ...`)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from broker.config import load_broker_config
from namesrv.config import NamesrvConfig, read_properties

REPO = Path(__file__).resolve().parents[2]


def services() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def broker_args(svc: dict) -> tuple[str, dict[str, str]]:
    """(conf path, -D overrides) of the `exec mqbroker ...` in a service's shell command."""
    cmd = svc["command"][-1] if isinstance(svc["command"], list) else svc["command"]
    argv = shlex.split(cmd.split("exec ", 1)[1])
    assert argv[0] == "mqbroker" and argv[1] == "-c"
    overrides = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-D")
    return argv[2], overrides


def test_one_service_per_process_and_a_volume_per_broker():
    doc = services()
    names = set(doc["services"])
    assert names == {"namesrv", "broker-n0", "broker-n1", "broker-n2", "console"}
    volumes = set()
    for i in range(3):
        svc = doc["services"][f"broker-n{i}"]
        store = [v.split(":")[0] for v in svc["volumes"] if v.endswith(":/store")]
        assert len(store) == 1 and store[0] in doc["volumes"]
        volumes.add(store[0])
    assert len(volumes) == 3  # no two brokers share a store


def test_broker_overrides_load_and_agree_on_the_group(tmp_path):
    doc = services()
    peers = set()
    for i in range(3):
        conf, overrides = broker_args(doc["services"][f"broker-n{i}"])
        cfg = load_broker_config(str(REPO / conf), overrides)  # a typo or bad value raises
        assert cfg.dledger_self_id == f"n{i}" and cfg.enable_dledger_commit_log
        assert cfg.broker_ip1 == f"broker-n{i}" and cfg.namesrv_addr == "namesrv:9876"
        peers.add(cfg.dledger_peers)
    assert len(peers) == 1


def test_console_reads_the_name_server_and_listens_on_every_interface():
    svc = services()["services"]["console"]
    argv = shlex.split(svc["command"][-1].split("exec ", 1)[1])
    assert argv[0] == "mqdashboard"
    assert argv[argv.index("-n") + 1] == "namesrv:9876"
    assert argv[argv.index("--host") + 1] == "0.0.0.0"  # published through the port mapping
    port = argv[argv.index("--port") + 1]
    assert f"{port}:{port}" in svc["ports"]


def test_name_server_listens_on_every_interface_although_conf_says_loopback():
    svc = services()["services"]["namesrv"]
    argv = shlex.split(svc["command"][-1].split("exec ", 1)[1])
    assert argv[:3] == ["mqnamesrv", "-c", "conf/namesrv.conf"]
    assert read_properties(REPO / argv[2])["listenHost"] == "127.0.0.1"  # make run: loopback only
    overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "-D"]
    props = {**read_properties(REPO / argv[2]), **dict(o.split("=", 1) for o in overrides)}
    cfg = NamesrvConfig.from_properties(props, "docker-compose.yml")
    assert cfg.listen_host == "0.0.0.0"  # published through the port mapping
    assert "9876:9876" in svc["ports"]


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose is not installed")
def test_docker_compose_config_accepts_the_file():
    out = subprocess.run(
        ["docker-compose", "-f", str(REPO / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr


def test_grpc_endpoints_published_at_the_port_routes_name():
    """A route names each broker's gRPC endpoint as brokerIP1:grpcServerPort: published on that same
    port, distinct per broker, a client outside the compose network reaches every one."""
    doc = services()
    ports = set()
    for i in range(3):
        svc = doc["services"][f"broker-n{i}"]
        conf, overrides = broker_args(svc)
        cfg = load_broker_config(str(REPO / conf), overrides)
        assert cfg.grpc_addr == f"broker-n{i}:{cfg.grpc_server_port}"
        assert f"{cfg.grpc_server_port}:{cfg.grpc_server_port}" in svc["ports"]
        ports.add(cfg.grpc_server_port)
    assert len(ports) == 3
