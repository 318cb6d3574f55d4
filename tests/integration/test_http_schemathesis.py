"""schemathesis against the OpenAPI document of a running broker: no 5xx, every response matches its
schema and content type, and invalid input is rejected. Skipped when schemathesis (an optional dev
dependency) is not installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.integration._ledgermq_procs import CONF, ProcessGroup, start_broker

pytest.importorskip("schemathesis")
pytestmark = pytest.mark.slow

CHECKS = (
    "not_a_server_error,response_schema_conformance,content_type_conformance,status_code_conformance,"
    "negative_data_rejection"
)


def test_openapi_fuzz_finds_no_5xx_and_no_schema_violation(tmp_path):
    group = ProcessGroup(tmp_path)
    try:
        addr = start_broker(
            group, tmp_path, CONF / "broker-single.conf", "broker-st", None, brokerSuspendMaxTimeMillis="300"
        )
        httpx.put(f"http://{addr}/topics/orders", json={"readQueueNums": 2, "writeQueueNums": 2})
        exe = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or "schemathesis"
        proc = subprocess.run(
            [
                exe,
                "run",
                f"http://{addr}/openapi.json",
                "--checks",
                CHECKS,
                "--max-examples",
                "15",
                "--seed",
                "20261122",
                "--no-color",
            ],
            capture_output=True,
            text=True,
            timeout=240,
            cwd=tmp_path,
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-6000:]
        assert "passed" in out
        log = group.log_text("broker-st")
        assert "event=http_unhandled" not in log, log[-3000:]
    finally:
        group.stop_all()
