"""Marks the tests `make test` must run alone: those that kill or stop members and time the
recovery, or assert other deadlines, which a second test beside them on CI's two cores would
stretch. `make test` runs them one at a time first, then tests/fault (whose scenarios time
failovers too, but are measured to keep their bounds two at a time beside each other), then every
other test two at a time (pytest-xdist); plain `pytest` runs everything one at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent
SERIAL = frozenset({
    "browser",
    "integration/test_batching_producer.py",
    "integration/test_blocking_send.py",
    "integration/test_consumers.py",
    "integration/test_devcluster.py",
    "integration/test_dledger_cluster.py",
    "integration/test_grpc_failover.py",
    "integration/test_hung_master.py",
    "integration/test_multi_set.py",
    "integration/test_namesrv_down.py",
    "integration/test_namesrv_process.py",
    "integration/test_newcomer_grpc_whole_set.py",
    "integration/test_newcomer_run.py",
    "integration/test_slow_clients.py",
})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        rel = Path(item.path).resolve().relative_to(_TESTS)
        if rel.parts[0] in SERIAL or rel.as_posix() in SERIAL:
            item.add_marker(pytest.mark.serial)
