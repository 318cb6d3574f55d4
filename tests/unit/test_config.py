"""RocketMQ .properties loader: known keys typed, RocketMQ-only keys warned, typos refused."""

import logging

import pytest

from broker.config import BrokerConfig, ConfigError, config_from_mapping, load_broker_config, parse_properties
from broker.errors import BrokerCode, BrokerError
from broker.topics import validate_topic

ROCKETMQ_N0 = """\
# distribution/conf/dledger/broker-n0.conf
brokerClusterName = RaftCluster
brokerName=RaftNode00
listenPort=30911
namesrvAddr=127.0.0.1:9876
storePathRootDir={root}
storePathCommitLog={root}/commitlog
enableDLegerCommitLog=true
dLegerGroup=RaftNode00
dLegerPeers=n0-127.0.0.1:40911;n1-127.0.0.1:40912;n2-127.0.0.1:40913
dLegerSelfId=n0
sendMessageThreadPoolNums=16
fetchNamesrvAddrByAddressServer : false
flushDiskType=SYNC_FLUSH
deleteWhen=04
fileReservedTime=48
diskMaxUsedSpaceRatio=80
maxMessageSize=1048576
"""


def test_rocketmq_file_loads_with_one_warning_per_unimplemented_key(tmp_path, caplog):
    p = tmp_path / "broker-n0.conf"
    p.write_text(ROCKETMQ_N0.format(root=tmp_path))
    with caplog.at_level(logging.WARNING, logger="broker.config"):
        cfg = load_broker_config(str(p))
    assert cfg.broker_cluster_name == "RaftCluster" and cfg.listen_port == 30911
    assert cfg.enable_dledger_commit_log is True and cfg.dledger_self_id == "n0"
    assert cfg.flush_disk_type == "SYNC_FLUSH" and cfg.max_message_size == 1048576
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3
    assert any("sendMessageThreadPoolNums" in w for w in warned)
    assert any("fetchNamesrvAddrByAddressServer" in w for w in warned)
    dc = cfg.to_dledger_config()
    assert dc.group == "RaftNode00" and dc.self_id == "n0" and dc.file_reserved_hours == 49
    assert dc.disk_space_ratio_to_check_expired == 0.80 and dc.sync_flush


def test_max_pending_requests_num_reaches_the_dledger_config(tmp_path):
    p = tmp_path / "b.conf"
    p.write_text("brokerName=a\nmaxPendingRequestsNum=2000\n")
    cfg = load_broker_config(str(p))
    assert cfg.max_pending_requests_num == 2000
    assert cfg.to_dledger_config().max_pending_requests_num == 2000
    p.write_text("brokerName=a\nmaxPendingRequestsNum=0\n")
    with pytest.raises(ConfigError) as ei:
        load_broker_config(str(p))
    assert ei.value.key == "maxPendingRequestsNum"


def test_peer_secret_file_reaches_the_dledger_config_and_a_loose_one_is_refused(tmp_path):
    secret = tmp_path / "peer.secret"
    secret.write_text("s" * 64 + "\n")
    secret.chmod(0o600)
    p = tmp_path / "b.conf"
    p.write_text(ROCKETMQ_N0.format(root=tmp_path)
                 + f"peerSecretFile={secret}\npeerHandshakeTimeoutMs=3000\n")
    dc = load_broker_config(str(p)).to_dledger_config()
    assert dc.peer_secret_file == str(secret) and dc.peer_handshake_timeout_ms == 3000
    assert dc.peer_auth() is not None
    secret.chmod(0o644)  # readable by others: refused at start, naming the key and the fix
    with pytest.raises(ConfigError) as ei:
        load_broker_config(str(p))
    assert ei.value.key == "peerSecretFile" and "chmod 600" in ei.value.reason


def test_typo_refused_with_file_line_and_nearest_key(tmp_path):
    p = tmp_path / "b.conf"
    p.write_text("brokerName=a\nlistenPrt=1234\n")
    with pytest.raises(ConfigError) as ei:
        load_broker_config(str(p))
    e = ei.value
    assert e.key == "listenPrt" and e.nearest == "listenPort" and e.reason == "unknown key"
    assert f"{p}:2" in str(e)


@pytest.mark.parametrize("line,key", [
    ("listenPort=abc", "listenPort"), ("listenPort=70000", "listenPort"),
    ("enableDLegerCommitLog=maybe", "enableDLegerCommitLog"), ("flushDiskType=SOMETIMES", "flushDiskType"),
    ("dLegerPeers=n0:1", "dLegerPeers"), ("deleteWhen=25", "deleteWhen"),
    ("diskMaxUsedSpaceRatio=99", "diskMaxUsedSpaceRatio"), ("maxMessageSize=-1", "maxMessageSize"),
    # A name the name servers would refuse: the broker would run but never be routed to.
    ("brokerName=broker a", "brokerName"), ("brokerName=" + "b" * 128, "brokerName"),
    ("idempotencyMaxKeys=0", "idempotencyMaxKeys"),
])
def test_bad_value_refused(tmp_path, line, key):
    p = tmp_path / "b.conf"
    p.write_text(line + "\n")
    with pytest.raises(ConfigError) as ei:
        load_broker_config(str(p))
    assert ei.value.key == key and "bad value" in ei.value.reason


def test_self_id_must_be_in_peers(tmp_path):
    p = tmp_path / "b.conf"
    p.write_text("enableDLegerCommitLog=true\ndLegerPeers=n0-127.0.0.1:1\ndLegerSelfId=n7\n")
    with pytest.raises(ConfigError) as ei:
        load_broker_config(str(p))
    assert ei.value.key == "dLegerSelfId"


def test_properties_syntax():
    text = "a=1\n! c\n# c\nb : two words \nc   3\nd=x\\\n  y\n"
    assert [(k, v) for _, k, v in parse_properties(text)] == [("a", "1"), ("b", "two words"), ("c", "3"),
                                                              ("d", "xy")]


@pytest.mark.parametrize("name", ["", "a/b", "..", "a.b", "x" * 128, "TBW102", "RMQ_SYS_CONSUMER_OFFSETS",
                                  "rmq_sys_x", "a b", "é"])
def test_bad_topic_names(name):
    with pytest.raises(BrokerError) as ei:
        validate_topic(name)
    assert ei.value.code == BrokerCode.INVALID_TOPIC


@pytest.mark.parametrize("name", ["a", "%RETRY%group-1", "x" * 127, "A|b_c-9"])
def test_good_topic_names(name):
    assert validate_topic(name) == name


def test_properties_show_every_setting_as_a_file_would_and_read_back_the_same(tmp_path):
    """What `mqadmin getBrokerConfig` shows: each implemented key once (an alias is not a second
    setting), defaults included, in `.properties` spelling; its keys that have a value, read back,
    give the same config (an empty one is a setting left unset)."""
    p = tmp_path / "b.conf"
    p.write_text("brokerName=broker-x\nflushDiskType=SYNC_FLUSH\nlongPollingEnable=false\n"
                 "maxConnectionsPerIp=7\npreferredLeaderId=n1\ntls.client.keyPassword=s3cret\n")
    cfg = load_broker_config(str(p))
    props = cfg.properties()
    assert props["brokerName"] == "broker-x" and props["flushDiskType"] == "SYNC_FLUSH"
    assert props["longPollingEnable"] == "false" and props["maxConnectionsPerIp"] == "7"
    assert props["preferredLeaderIds"] == "n1" and "preferredLeaderId" not in props
    assert props["defaultTopicQueueNums"] == "8" and props["tls.server.mode"] == "disabled"
    assert props["tls.client.keyPassword"] == "******" and "s3cret" not in str(props)
    valued = {k: v for k, v in props.items() if v not in ("", "******")}
    again = config_from_mapping(valued, source=cfg.source)
    again.tls_client.key_password = cfg.tls_client.key_password
    assert again == cfg
    assert BrokerConfig().properties()["tls.client.keyPassword"] == ""  # nothing set: nothing masked
