"""LedgerMQ pipeline: the ``ledgermq`` PySpark data source (stream + batch reader, sink) and the demo job.

``pipeline.session()`` builds a SparkSession with the source and sink registered;
``pipeline.register(spark)`` registers them with a session of your own. Either way Spark's Python
workers (which run the source's ``read()`` and the sink's ``write()``) must be able to import this
package: a worker started from another interpreter dies deep in a Spark trace with
``ModuleNotFoundError``. So ``register`` sees to it: when neither ``PYSPARK_PYTHON`` nor
``spark.pyspark.python`` names the workers' interpreter, they run this one (the one that imported
``pipeline``); when one does, that interpreter is checked and ``register`` fails at once with one
line naming what to set.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# What a worker must import to run the source and the sink.
WORKER_IMPORTS = "import pipeline.source, pipeline.sink"


class WorkerPythonError(RuntimeError):
    """Spark's Python workers would run an interpreter that cannot import ``pipeline``."""


def session(app_name: str = "ledgermq", master: str = "local[*]", **conf: Any) -> SparkSession:
    """A SparkSession (``getOrCreate``) whose Python workers run this interpreter, with the
    ``ledgermq`` source and sink registered. ``conf``: more Spark settings, e.g.
    ``**{"spark.sql.shuffle.partitions": "4"}``."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in {"spark.pyspark.python": os.environ["PYSPARK_PYTHON"], **conf}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark


def register(spark: SparkSession) -> None:
    """Register the ``ledgermq`` data source with ``spark`` (per session; call once), after
    making sure its Python workers can import it (see the module docstring); raises
    ``WorkerPythonError`` with one line saying what to set when they cannot."""
    from pipeline.source import LedgerMQDataSource

    ensure_worker_python(spark)
    spark.dataSource.register(LedgerMQDataSource)


def ensure_worker_python(spark: SparkSession) -> str:
    """The interpreter ``spark``'s Python workers will run, set to this one unless the user chose
    one, and checked to import ``pipeline`` when they did."""
    try:
        sc = spark.sparkContext
    except Exception:  # Spark Connect: the server's workers are not ours to choose or check
        return ""
    chosen = os.environ.get("PYSPARK_PYTHON") or spark.conf.get("spark.pyspark.python", None)
    if not chosen or os.path.realpath(chosen) == os.path.realpath(sys.executable):
        sc.pythonExec = sys.executable
        return sys.executable
    sc.pythonExec = chosen
    try:
        check = subprocess.run(
            [chosen, "-c", WORKER_IMPORTS], cwd="/", capture_output=True, text=True, timeout=60
        )
        problem = check.stderr.strip().splitlines()[-1] if check.returncode else ""
    except OSError as exc:
        problem = str(exc)
    if problem:
        raise WorkerPythonError(
            f"ledgermq: Spark's Python workers would run {chosen} (PYSPARK_PYTHON / spark.pyspark.python), "
            f"which cannot import pipeline ({problem}): set PYSPARK_PYTHON to {sys.executable}, or unset it"
        )
    return chosen


__all__ = ["WorkerPythonError", "ensure_worker_python", "register", "session"]
