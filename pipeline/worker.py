"""Per-process setup of the Spark Python workers that run the source's ``read()`` and the sink's ``write()``.

PySpark's daemon calls ``gc.collect()`` in a reused worker after every task (pyspark/daemon.py).
A worker that has imported pyspark, pyarrow, pandas, numpy and httpx holds ~90,000 objects the
cyclic collector walks each time: 34-38 ms of CPU per task, measured, i.e. ~40 % of the Python
worker's CPU for a 12,500-row task of 1 KB messages (docs/PERFORMANCE.md, Spark). Those objects
are modules, classes and functions that live as long as the process, so after the first task's
imports they are moved out of the collector's reach with ``gc.freeze()``; objects created later
(pages, batches) are collected as usual.
"""

from __future__ import annotations

import gc
import logging
import os

log = logging.getLogger("ledgermq.pipeline.worker")

_frozen_pid: int | None = None


def freeze_worker_heap() -> None:
    """Once per process (a forked worker counts as a new one): collect, then ``gc.freeze()``."""
    global _frozen_pid
    pid = os.getpid()
    if _frozen_pid == pid:
        return
    _frozen_pid = pid
    gc.collect()  # drop what is already garbage, so it is not frozen with the rest
    gc.freeze()
    log.debug("event=gc_frozen pid=%d objects=%d", pid, gc.get_freeze_count())
