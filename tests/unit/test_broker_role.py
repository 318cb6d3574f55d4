"""Broker ids of DLedger members, and the role transitions of a controller (no network)."""

from broker.config import BrokerConfig
from broker.role import BrokerRole, slave_broker_id


def test_slave_broker_id_rocketmq_rule():
    assert slave_broker_id("n0", ["n0", "n1", "n2"]) == 1
    assert slave_broker_id("n2", ["n0", "n1", "n2"]) == 3
    assert slave_broker_id("b", ["c", "a", "b"]) == 2


async def test_local_controller_is_master(tmp_path):
    from broker.controller import BrokerController
    from broker.message import Message

    ctl = BrokerController(BrokerConfig(store_path_root_dir=str(tmp_path), broker_id=0,
                                        mapped_file_size_commit_log=1 << 16))
    seen = []
    ctl.add_role_listener(lambda c: seen.append(c.role))
    await ctl.start()
    try:
        assert ctl.role == BrokerRole.MASTER and ctl.broker_id == 0 and ctl.master_addr == "127.0.0.1:10911"
        r = await ctl.store.put_messages("T", [Message("T", b"x")])
        assert r[0].queue_offset == 0
        st = ctl.status()
        assert st["role"] == "MASTER" and st["brokerId"] == 0 and "dledger" not in st
    finally:
        await ctl.shutdown()
    assert seen == []
