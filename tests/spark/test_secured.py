"""The source and the sink against a secured cluster: a name server and a broker serving only HTTPS
(`tls.server.mode=enforcing`, a private CA) with ACL on (`aclEnable=true`). Options `token` and
`caFile` (the SDK's `token`/`ca_file`) make a query work; without them it fails naming what is
wrong, and a `caFile` that cannot be read fails the query at once, naming the option.

QA: the pipeline had no way to send a token or trust a private CA, so no Spark query could read
from or write to a cluster with ACL or TLS switched on."""

from __future__ import annotations

import json
import ssl

import httpx
import pytest
from pyspark.errors import PySparkException
from pyspark.sql.types import StringType, StructField, StructType

from pipeline import job
from tests.integration._ledgermq_procs import ProcessGroup
from tests.tls_certs import make_pki, start_https_namesrv_and_broker, wait_https

ADMIN_TOKEN = "spark-admin-token-0123456789"
APP_TOKEN = "spark-app-token-0123456789"


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    d = tmp_path_factory.mktemp("spark-secured")
    pki = make_pki(d / "pki")
    acl = d / "acl.json"
    acl.write_text(json.dumps({"accounts": [
        {"name": "admin", "token": ADMIN_TOKEN, "admin": True},
        # The pipeline's account: its topics and its consumer group, nothing else.
        {"name": "spark", "token": APP_TOKEN, "topicPerms": {"spark-sec": "PUB|SUB"},
         "groupPerms": {"spark-sec-group": "SUB"}},
    ]}))
    group = ProcessGroup(d)
    try:
        ns, broker = start_https_namesrv_and_broker(group, d, pki, aclEnable="true", aclConfigFile=str(acl))
        tls = ssl.create_default_context(cafile=str(pki.ca))
        r = httpx.put(f"https://{broker}/topics/spark-sec",
                      json={"readQueueNums": 2, "writeQueueNums": 2},
                      headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, verify=tls, timeout=10)
        assert r.status_code == 200, r.text
        wait_https(f"https://{ns}/routes/spark-sec", str(pki.ca), group.procs["namesrv"])
        yield {"ns": ns, "ca": str(pki.ca), "pki": pki}
    finally:
        group.stop_all()


def _write(spark, secured, rows: list[tuple[str, str]], **access: str) -> None:
    schema = StructType([StructField("value", StringType()), StructField("key", StringType())])
    (spark.createDataFrame(rows, schema).write.format("ledgermq").option("namesrvAddr", secured["ns"])
     .option("topic", "spark-sec").options(**access).mode("append").save())


def test_the_sink_and_the_source_work_with_a_token_and_a_ca_file(spark, secured) -> None:
    access = {"token": APP_TOKEN, "caFile": secured["ca"]}
    rows = [(f"secured-{i}", f"k{i}") for i in range(50)]
    _write(spark, secured, rows, **access)

    got = (spark.read.format("ledgermq").option("namesrvAddr", secured["ns"]).option("topic", "spark-sec")
           .options(**access).load().selectExpr("CAST(value AS STRING) AS v", "key").collect())
    assert sorted((r.v, r.key) for r in got) == sorted(rows)


def test_the_job_streams_and_commits_its_group_with_the_token_and_ca_from_its_environment(
    spark, secured, tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("LEDGERMQ_TOKEN", APP_TOKEN)
    monkeypatch.setenv("LEDGERMQ_CA_FILE", secured["ca"])
    tls = ssl.create_default_context(cafile=secured["ca"])
    route = httpx.get(f"https://{secured['ns']}/routes/spark-sec", verify=tls, timeout=10).json()
    broker = route["brokers"][0]["masterAddr"]

    def offsets() -> httpx.Response:
        return httpx.get(f"https://{broker}/consumers/spark-sec-group/offsets", params={"topic": "spark-sec"},
                         headers={"Authorization": f"Bearer {APP_TOKEN}"}, verify=tls, timeout=10)

    before = {q["queueId"]: q["maxOffset"] for q in offsets().json()["offsets"]}
    assert sum(before.values()) >= 1, before
    args = job.parse_args(["--topic", "spark-sec", "--out", str(tmp_path / "out"), "--checkpoint",
                           str(tmp_path / "ckpt"), "--namesrv", secured["ns"], "--trigger", "availableNow",
                           "--consumer-group", "spark-sec-group"])
    for run in range(2):
        query = job.start_query(spark, args)
        query.awaitTermination(120)
        assert query.exception() is None
        if run == 0:
            _write(spark, secured, [("more", "m")], token=APP_TOKEN, caFile=secured["ca"])
    assert spark.read.parquet(str(tmp_path / "out")).count() == sum(before.values()) + 1
    # Spark commits batch N to its source when it plans batch N + 1: the group holds the first run's end.
    progress = offsets()
    assert progress.status_code == 200, progress.text
    assert {q["queueId"]: q["offset"] for q in progress.json()["offsets"]} == before, progress.text


def test_without_the_token_or_the_ca_the_query_fails_saying_why(spark, secured) -> None:
    def read(**options: str) -> None:
        (spark.read.format("ledgermq").option("namesrvAddr", secured["ns"]).option("topic", "spark-sec")
         .options(**options).load().count())

    with pytest.raises(PySparkException) as no_token:
        read(caFile=secured["ca"])
    assert "401" in str(no_token.value), str(no_token.value)[:2000]
    assert "option 'token'" in str(no_token.value), str(no_token.value)[:2000]

    with pytest.raises(PySparkException) as write_without_token:
        _write(spark, secured, [("refused", "r")], caFile=secured["ca"])
    assert "401" in str(write_without_token.value), str(write_without_token.value)[:2000]
    assert "after 1 attempt" in str(write_without_token.value), str(write_without_token.value)[:2000]

    with pytest.raises(PySparkException) as no_ca:
        read(token=APP_TOKEN)
    assert "option 'caFile'" in str(no_ca.value), str(no_ca.value)[:2000]

    with pytest.raises(PySparkException) as bad_path:
        read(token=APP_TOKEN, caFile=str(secured["pki"].ca) + ".missing")
    assert "option 'caFile' cannot be used" in str(bad_path.value), str(bad_path.value)[:2000]

