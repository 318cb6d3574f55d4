"""RocketMQ .properties loader: known keys typed, RocketMQ-only keys warned, typos refused."""

import logging
import os

import pytest

from broker.config import (
    BrokerConfig,
    ConfigError,
    apply_runtime_updates,
    config_from_mapping,
    load_broker_config,
    load_runtime_updates,
    parse_properties,
    parse_runtime_updates,
    save_runtime_updates,
    updates_path,
)
from broker.errors import BrokerCode, BrokerError
from broker.topics import validate_topic
from tests.tls_certs import make_pki

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


def test_peer_tls_keys_reach_the_dledger_config_and_need_each_other(tmp_path):
    pki = make_pki(tmp_path / "pki")
    p = tmp_path / "b.conf"
    keys = {"peerTlsCertPath": pki.peer_cert, "peerTlsKeyPath": pki.peer_key, "peerTlsTrustCertPath": pki.ca}
    p.write_text(ROCKETMQ_N0.format(root=tmp_path) + "".join(f"{k}={v}\n" for k, v in keys.items()))
    tls = load_broker_config(str(p)).to_dledger_config().peer_tls()
    assert tls is not None and (tls.cert_file, tls.key_file, tls.ca_file) == tuple(map(str, keys.values()))
    p.write_text(ROCKETMQ_N0.format(root=tmp_path) + f"peerTlsCertPath={pki.peer_cert}\n")
    with pytest.raises(ConfigError) as partial:
        load_broker_config(str(p))
    assert partial.value.key == "peerTlsKeyPath" and "together" in partial.value.reason
    p.write_text(ROCKETMQ_N0.format(root=tmp_path) + f"peerTlsCertPath={pki.peer_cert}\n"
                 f"peerTlsKeyPath={pki.server_key}\npeerTlsTrustCertPath={pki.ca}\n")  # not the cert's key
    with pytest.raises(ConfigError) as mismatch:
        load_broker_config(str(p))
    assert mismatch.value.key == "peerTlsCertPath" and "cannot load" in mismatch.value.reason


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
    ("brokerPermission=7", "brokerPermission"), ("brokerPermission=rw", "brokerPermission"),
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


def test_broker_permission_takes_reads_or_writes_out_of_what_the_topics_register():
    """RocketMQ's brokerPermission: 4 registers every topic without WRITE (producers are routed
    elsewhere), 2 without READ; a topic's own PRIORITY/INHERIT bits are kept."""
    cfg = config_from_mapping({"brokerPermission": "4"})
    assert (cfg.broker_readable, cfg.broker_writable) == (True, False)
    assert [cfg.registered_perm(p) for p in (6, 4, 2, 14)] == [4, 4, 0, 12]
    cfg = config_from_mapping({"brokerPermission": "2"})
    assert [cfg.registered_perm(p) for p in (6, 4, 2)] == [2, 0, 2]
    assert [BrokerConfig().registered_perm(p) for p in (6, 4, 2, 0)] == [6, 4, 2, 0]


@pytest.mark.parametrize(("key", "value", "reason"), [
    ("brokerPermision", "4", "unknown key"),  # the typo gets the nearest key below
    ("listenPort", "10912", "read at start only"),
    ("tls.server.mode", "required", "read at start only"),
    ("haListenPort", "1", "not implemented"),
    ("brokerPermission", "5", "bad value"),
    ("brokerPermission", "", "bad value"),
    ("fileReservedTime", "0", "bad value"),
    ("deleteWhen", "25", "bad value"),
    ("diskMaxUsedSpaceRatio", "99", "bad value"),
    ("diskSpaceCleanForciblyRatio", "95", "bad value"),
    ("maxReconsumeTimes", "-1", "bad value"),
    ("longPollingEnable", "maybe", "bad value"),
    ("brokerSuspendMaxTimeMillis", "0", "bad value"),
    ("mappedFileSizeCommitLog", "1024", "read at start only"),
])
def test_a_runtime_update_names_the_key_it_refuses(key, value, reason):
    with pytest.raises(ConfigError) as ei:
        parse_runtime_updates({key: value}, "update")
    assert ei.value.key == key and reason in ei.value.reason
    if key == "brokerPermision":
        assert ei.value.nearest == "brokerPermission"


def test_runtime_updates_are_saved_and_read_again_at_start_over_the_config_file(tmp_path):
    conf = tmp_path / "b.conf"
    conf.write_text(f"storePathRootDir={tmp_path / 'store'}\nbrokerPermission=6\n")
    cfg = load_broker_config(str(conf))
    assert load_runtime_updates(cfg) == {}  # nothing saved yet: the file's values stand
    parsed = parse_runtime_updates({"brokerPermission": "4"}, "update")
    path = save_runtime_updates(cfg, parsed)
    assert path == updates_path(cfg) and cfg.broker_permission == 6  # saving does not apply
    assert apply_runtime_updates(cfg, parsed) == {"brokerPermission": ("6", "4")}
    restarted = load_broker_config(str(conf))
    assert restarted.broker_permission == 6
    assert load_runtime_updates(restarted) == {"brokerPermission": ("6", "4")}
    assert restarted.broker_permission == 4 and restarted.properties()["brokerPermission"] == "4"
    # A later update rewrites the saved value; the file stays a .properties file a human can read.
    save_runtime_updates(cfg, parse_runtime_updates({"brokerPermission": "6"}, "update"))
    assert [(k, v) for _, k, v in parse_properties(open(path).read())] == [("brokerPermission", "6")]
    assert not (tmp_path / "store" / "config" / "updateBrokerConfig.properties.tmp").exists()


def test_retention_updates_reach_a_running_dledger_store_config():
    """The DLedger store's clean-up reads its own DLedgerConfig: an update of the broker's
    retention keys is carried into it the way RocketMQ builds it (fileReservedTime + 1 hours,
    ratios as fractions; the disk-full ratio follows the force-clean one)."""
    cfg = config_from_mapping({"enableDLegerCommitLog": "true", "dLegerSelfId": "n0",
                               "dLegerPeers": "n0-127.0.0.1:40911"})
    live = cfg.to_dledger_config()
    assert (live.file_reserved_hours, live.delete_when) == (73, "04")
    parsed = parse_runtime_updates({"fileReservedTime": "24", "deleteWhen": "02;14",
                                    "diskMaxUsedSpaceRatio": "60", "diskSpaceCleanForciblyRatio": "70"},
                                   "update")
    assert apply_runtime_updates(cfg, parsed)["fileReservedTime"] == ("72", "24")
    cfg.retention_into(live)
    assert (live.file_reserved_hours, live.delete_when) == (25, "02;14")
    assert (live.disk_space_ratio_to_check_expired, live.disk_space_ratio_to_force_clean) == (0.6, 0.7)
    assert live.disk_full_ratio == pytest.approx(0.75) == cfg.disk_full_ratio
    assert live == cfg.to_dledger_config()  # as a broker started with these values builds it


def test_a_damaged_saved_update_stops_the_start_naming_file_line_and_key(tmp_path):
    cfg = config_from_mapping({"storePathRootDir": str(tmp_path)})
    os.makedirs(os.path.dirname(updates_path(cfg)))
    with open(updates_path(cfg), "w") as f:
        f.write("# comment\nbrokerPermission=9\n")
    with pytest.raises(ConfigError) as ei:
        load_runtime_updates(cfg)
    assert ei.value.key == "brokerPermission" and ei.value.source == f"{updates_path(cfg)}:2"
    assert cfg.broker_permission == 6
