"""The README's Spark snippets, run as a newcomer would: a fresh Python process from the project's
venv, no PYSPARK_PYTHON set, outside the repository. Without `pipeline` seeing to the workers'
interpreter, the source's first task died with `ModuleNotFoundError: No module named 'httpx'`.
And an interpreter named in PYSPARK_PYTHON that cannot import `pipeline` is refused at
`register` with one line saying what to set."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import venv

import pytest

import pipeline
from tests.integration._ledgermq_procs import REPO

pytestmark = pytest.mark.spark


def readme_spark_blocks() -> list[str]:
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Spark") :]
    section = section[: section.index("\n## ", 3)]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_the_readme_spark_snippets_work_in_a_fresh_process_without_pyspark_python(cluster, tmp_path):
    src, copy = "readme_orders", "readme_orders_copy"
    cluster.create_topic(src, queues=2)
    cluster.create_topic(copy, queues=2)
    cluster.produce(src, [f"o{i}".encode() for i in range(50)])
    blocks = readme_spark_blocks()
    assert len(blocks) == 2, "the README's Spark section changed: update this test"
    code = "\n".join(blocks)
    for old, new in (
        ("127.0.0.1:9876", cluster.namesrv),
        ('"orders-copy"', f'"{copy}"'),
        ('"orders"', f'"{src}"'),
        ("/data/", f"{tmp_path}/data/"),
    ):
        assert old in code
        code = code.replace(old, new)
    script = tmp_path / "readme.py"
    script.write_text(
        code
        + textwrap.dedent(
            f"""
            for q in spark.streams.active:
                q.processAllAvailable()
                q.stop()
            print("parquet rows", spark.read.parquet("{tmp_path}/data/orders").count())
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    env.pop("PYTHONPATH", None)
    run = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "parquet rows 50" in run.stdout
    assert sorted(m["value"] for m in cluster.pull_all(copy)) == sorted(f"o{i}".encode() for i in range(50))


def test_register_refuses_a_worker_python_that_cannot_import_pipeline_in_one_line(
    spark, tmp_path, monkeypatch
):
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)
    python = str(bare / "bin" / "python")
    monkeypatch.setenv("PYSPARK_PYTHON", python)
    try:
        with pytest.raises(pipeline.WorkerPythonError) as info:
            pipeline.register(spark)
    finally:
        spark.sparkContext.pythonExec = sys.executable  # the shared session keeps working
    message = str(info.value)
    assert "\n" not in message
    assert python in message and f"set PYSPARK_PYTHON to {sys.executable}" in message
    assert "ModuleNotFoundError" in message
