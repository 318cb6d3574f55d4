"""Row schema of the ``ledgermq`` source, modelled on Spark's Kafka source, in Spark and Arrow form."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

_BEFORE_PROPERTIES = [
    StructField("key", StringType(), True),  # first of the message's keys (KEYS property)
    StructField("value", BinaryType(), True),  # the body
    StructField("topic", StringType(), False),
    StructField("brokerName", StringType(), False),
    StructField("queueId", IntegerType(), False),
    StructField("queueOffset", LongType(), False),
    StructField("commitLogOffset", LongType(), False),
    StructField("msgId", StringType(), True),
    StructField("tags", StringType(), True),
]
_PROPERTIES = StructField("properties", MapType(StringType(), StringType(), True), True)
_AFTER_PROPERTIES = [
    StructField("bornTimestamp", TimestampType(), True),
    StructField("storeTimestamp", TimestampType(), True),
]


def source_schema(include_properties: bool) -> StructType:
    """The source's Spark schema; ``properties`` only with ``includeProperties=true`` (like Kafka headers)."""
    fields = list(_BEFORE_PROPERTIES)
    if include_properties:
        fields.append(_PROPERTIES)
    fields.extend(_AFTER_PROPERTIES)
    return StructType(fields)


def source_arrow_schema(include_properties: bool) -> pa.Schema:
    """The Arrow schema ``read()`` must yield (Spark wants ``timestamp[us, UTC]``, int32 for INT)."""
    return to_arrow_schema(source_schema(include_properties), timezone="UTC")
