"""`make run` as a newcomer meets it: `ledgermq-run` started from the repository's own conf files
(every port moved to a free one, nothing else changed), then only what its banner and README.md
say — the printed curl lines run by a real shell and curl, the printed mqadmin line, the README's
Python SDK and RocketMQ 5 client snippets run verbatim in fresh interpreters, the README's mqadmin
commands, the console's pages — and Ctrl-C, after which no process of the cluster is left and its
temporary store is gone. One cluster for the module."""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.integration._ledgermq_procs import CONF, REPO
from tests.ports import free_port

pytestmark = pytest.mark.timeout(240)
PY = sys.executable
BIN = Path(PY).parent
# Keys whose values carry the ports a conf file binds or dials.
PORT_KEYS = ("listenPort", "grpcServerPort", "namesrvAddr", "dLegerPeers")


def readme_block(marker: str) -> str:
    """The README's ```python block that contains `marker`, without its statements that tail a
    topic forever (a loop over `iterate(...)` waits for new messages by design)."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    [block] = [b for b in blocks if marker in b]
    kept = [node for node in ast.parse(block).body if ".iterate(" not in ast.unparse(node)]
    return ast.unparse(ast.Module(kept, type_ignores=[]))


def move_ports(src: Path, dst: Path) -> None:
    """Copy the conf tree with every port in PORT_KEYS moved to a free one (the same new port for
    the same old one in every file, so the files still name each other)."""
    key_line = re.compile(rf"^({'|'.join(PORT_KEYS)})=(.*)$", re.M)
    port = re.compile(r"(?<=:)\d{2,5}\b|^\d{2,5}$")
    moved: dict[str, str] = {}

    def repl(m: re.Match[str]) -> str:
        new = port.sub(lambda p: moved.setdefault(p.group(0), str(free_port())), m.group(2))
        return f"{m.group(1)}={new}"

    for path in sorted(src.rglob("*.conf")):
        out = dst / path.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(key_line.sub(repl, path.read_text()))


@dataclass
class Run:
    """The running `ledgermq-run` and what its banner told the newcomer."""

    proc: subprocess.Popen[str]
    banner: str
    namesrv: str
    console: str
    store_dir: Path
    endpoints: str
    curls: list[str] = field(default_factory=list)
    children: list[int] = field(default_factory=list)


def children_of(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with open(task / "children") as f:
            out += [int(c) for c in f.read().split()]
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def parse_banner(text: str) -> dict[str, object]:
    lines = text.splitlines()
    curls, i = [], 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("curl "):
            cmd = line
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd[:-1] + " " + lines[i].strip()
            curls.append(cmd)
        i += 1
    return {
        "curls": curls,
        "namesrv": re.search(r"name server (\S+?),?\s", text).group(1),
        "console": re.search(r"Console: (http://\S+?)/?\s", text).group(1),
        "store": Path(re.search(r"Store and logs: (\S+)", text).group(1)),
        "endpoints": re.search(r'endpoints = "([^"]+)"', text).group(1),
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    conf = tmp_path_factory.mktemp("newcomer-conf")
    move_ports(CONF, conf)
    exe = BIN / "ledgermq-run"
    cmd = [str(exe)] if exe.exists() else [PY, "-m", "broker.devcluster"]
    proc = subprocess.Popen(
        [*cmd, "--conf-dir", str(conf), "--console-port", str(free_port())],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    out: list[str] = []
    try:
        deadline = time.monotonic() + 90
        while not any(line.startswith("Store and logs:") for line in out):
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "ledgermq-run exited:\n" + "".join(out)
            assert time.monotonic() < deadline, "no banner after 90 s:\n" + "".join(out)
            out.append(line)
        b = parse_banner("".join(out))
        r = Run(proc, "".join(out), b["namesrv"], b["console"], b["store"], b["endpoints"], b["curls"])
        r.children = children_of(proc.pid)
        yield r
    finally:
        if proc.poll() is None:
            for pid in children_of(proc.pid):
                os.kill(pid, signal.SIGTERM)
            proc.kill()
            proc.wait(10)


def sh(cmd: str, timeout: float = 60) -> str:
    done = subprocess.run(
        ["bash", "-c", cmd],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}"),
    )
    assert done.returncode == 0, f"{cmd}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_banner_names_every_process_and_the_master(run: Run) -> None:
    assert len(run.children) == 5, run.banner  # name server, three members, console
    assert run.banner.count("(master)") == 1, run.banner
    assert len(run.endpoints.split(";")) == 3


def test_the_printed_curl_lines_produce_pull_and_receive(run: Run) -> None:
    produce, pull, receive = (next(c for c in run.curls if p in c) for p in ("POST", "queues/0", "receive"))
    assert produce.count("/topics/demo/messages") == 1
    result = json.loads(sh(produce))["results"][0]
    assert result["queueId"] == 0
    pulled = json.loads(sh(pull))["messages"]
    assert [m["body"] for m in pulled if m["msgId"] == result["msgId"]] == ["hello"]
    received = json.loads(sh(receive))["messages"]
    assert result["msgId"] in {m["msgId"] for m in received}


def test_the_printed_mqadmin_line_lists_the_set(run: Run) -> None:
    line = next(line for line in run.banner.splitlines() if "mqadmin clusterList" in line)
    out = sh(line.split("|")[0].strip())
    assert out.count("broker-a") == 3 and "MASTER" in out


@pytest.mark.parametrize("marker", ["from client import ConsumeResult", "TransactionResolution"])
def test_readme_sdk_snippets_run_verbatim(run: Run, marker: str) -> None:
    code = readme_block(marker).replace("127.0.0.1:9876", run.namesrv)
    done = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    if marker == "TransactionResolution":
        assert done.stdout.split()[-1] == "COMMITTED", done.stdout


def test_readme_rocketmq5_snippet_then_the_console_finds_its_id(run: Run) -> None:
    """The id the official client prints is the one its application logs: the console finds the
    message by it (with its topic), as RocketMQ's dashboard does."""
    code = readme_block("from rocketmq import")
    code = re.sub(r"""(['"])127\.0\.0\.1:18081;[^'"]+\1""", repr(run.endpoints), code)
    done = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=90, cwd=REPO)
    assert done.returncode == 0, done.stderr
    msg_id = done.stdout.split()[-1]
    page = httpx.get(f"{run.console}/messages", params={"msgId": msg_id, "topic": "demo"}, timeout=30)
    assert page.status_code == 200
    assert 'data-testid="deliveries"' in page.text and "hello" in page.text, page.text[-2000:]
    # Without its topic the brokers are asked (they know a client's id within their idempotency
    # window); an id no broker knows says how to search for it.
    page = httpx.get(f"{run.console}/messages", params={"msgId": msg_id}, timeout=30)
    assert 'data-testid="deliveries"' in page.text and "hello" in page.text, page.text[-2000:]
    page = httpx.get(f"{run.console}/messages", params={"msgId": "0102FC" + "0" * 28}, timeout=30)
    assert "give its topic too" in page.text


def test_readme_mqadmin_commands(run: Run) -> None:
    n = f"-n {run.namesrv}"
    sh(f"mqadmin updateTopic {n} -t newcomer -r 2 -w 2")
    sent = sh(f"mqadmin sendMessage {n} -t newcomer -p hi --json")
    msg_id = json.loads(sent)[0]["msgId"]
    assert "hi" in sh(f"mqadmin consumeMessage {n} -t newcomer")
    assert msg_id in sh(f"mqadmin queryMsgById {n} -i {msg_id}")
    for cmd in (
        "topicList",
        "topicRoute -t newcomer",
        "topicStatus -t newcomer",
        "resetOffsetByTime -g newcomer-g -t newcomer -s 0",
        "consumerProgress -g newcomer-g",
    ):
        assert sh(f"mqadmin {cmd} {n}").strip(), cmd
    assert "newcomer" in sh(f"mqadmin deleteTopic {n} -t newcomer")


def test_console_pages_render(run: Run) -> None:
    for path in (
        "/cluster",
        "/topics",
        "/topics/demo",
        "/groups",
        "/groups/demo-group",
        "/messages",
        "/throughput",
        "/acl",
    ):
        r = httpx.get(run.console + path, timeout=30)
        assert r.status_code == 200 and "Console error" not in r.text, (path, r.text[-500:])
        if path not in ("/messages", "/acl", "/throughput"):
            assert "broker-a" in r.text, (path, r.text[-500:])


def test_ctrl_c_stops_every_process_and_removes_the_store(run: Run) -> None:
    """Last in the module: Ctrl-C (SIGINT to the foreground process) stops the whole cluster."""
    assert run.store_dir.is_dir()
    run.proc.send_signal(signal.SIGINT)
    rest, _ = run.proc.communicate(timeout=60)
    assert run.proc.returncode == 0, rest
    deadline = time.monotonic() + 10
    while any(alive(p) for p in run.children) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in run.children if alive(p)], rest
    assert not run.store_dir.exists()
