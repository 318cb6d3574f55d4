"""`mqnamesrv -c FILE -D KEY=VALUE -p PORT`: overrides apply over the file, bad ones are refused
naming the key (docker-compose opens conf/namesrv.conf's loopback name server to every interface
with `-D listenHost=0.0.0.0`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from namesrv.__main__ import load_config, parse_args

CONF = Path(__file__).resolve().parents[2] / "conf" / "namesrv.conf"


def test_conf_listens_on_loopback_and_D_overrides_it():
    assert load_config(parse_args(["-c", str(CONF)])).listen_host == "127.0.0.1"
    cfg = load_config(parse_args(["-c", str(CONF), "-D", "listenHost=0.0.0.0", "-D", "brokerExpiredMs=5000"]))
    assert (cfg.listen_host, cfg.broker_expired_ms, cfg.listen_port) == ("0.0.0.0", 5000, 9876)
    assert load_config(parse_args(["-D", "listenPort=1234", "-p", "4321"])).listen_port == 4321


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("listenHost", "expected KEY=VALUE"),
        ("=1", "expected KEY=VALUE"),
        ("listenHots=0.0.0.0", "did you mean listenHost?"),
        ("brokerExpiredMs=soon", "brokerExpiredMs='soon'"),
        ("listenPort=70000", "listenPort 70000 out of range"),
    ],
)
def test_a_bad_override_is_refused_naming_it(override, message):
    with pytest.raises(ValueError, match=message.replace("?", r"\?")):
        load_config(parse_args(["-c", str(CONF), "-D", override]))
