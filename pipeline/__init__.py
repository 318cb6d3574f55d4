"""LedgerMQ pipeline: the ``ledgermq`` PySpark data source (stream + batch reader, sink) and the demo job.

``pipeline.register(spark)`` makes ``spark.readStream.format("ledgermq")`` and
``df.writeStream.format("ledgermq")`` available in that session.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: SparkSession) -> None:
    """Register the ``ledgermq`` data source with ``spark`` (per session; call once)."""
    from pipeline.source import LedgerMQDataSource

    spark.dataSource.register(LedgerMQDataSource)


__all__ = ["register"]
