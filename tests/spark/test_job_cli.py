"""pipeline.job's command line and progress line (pure functions, no Spark started)."""

from __future__ import annotations

import pytest

from pipeline import job


def test_trigger_specs():
    assert job.trigger_kwargs("availableNow") == {"availableNow": True}
    assert job.trigger_kwargs("once") == {"once": True}
    assert job.trigger_kwargs("processingTime=5s") == {"processingTime": "5 seconds"}
    assert job.trigger_kwargs("processingTime=250ms") == {"processingTime": "250 milliseconds"}
    with pytest.raises(ValueError, match="--trigger"):
        job.trigger_kwargs("continuous=1s")


def test_parse_args_requires_topic_and_address(capsys):
    with pytest.raises(SystemExit):
        job.parse_args(["--out", "o", "--checkpoint", "c", "--namesrv", "x:1"])
    assert "exactly one of --topic and --topic-pattern" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        job.parse_args(["--topic", "t", "--out", "o", "--checkpoint", "c"])
    assert "--namesrv" in capsys.readouterr().err
    args = job.parse_args(
        ["--topic", "t", "--out", "o", "--checkpoint", "c", "--broker", "h:1", "--trigger", "once"]
    )
    assert args.trigger_kw == {"once": True} and args.format == "parquet"


def test_progress_line_reports_rows_offsets_and_lag():
    progress = {
        "batchId": 3,
        "numInputRows": 120,
        "processedRowsPerSecond": 400.0,
        "durationMs": {"triggerExecution": 300},
        "sources": [
            {
                "endOffset": '{"t": {"b:0": 10, "b:1": 5}}',
                "latestOffset": {"t": {"b:0": 25, "b:1": 5, "b:2": 4}},
            }
        ],
    }
    line = job.progress_line(progress)
    assert line.startswith("event=batch batchId=3 rows=120 durationMs=300 ")
    assert "lag=19" in line  # 15 on b:0, 4 on a queue the batch has not reached yet
    assert line.endswith('offsets={"t":{"b:0":10,"b:1":5}}')
    assert job.lag_of(None, {"t": {}}) is None
