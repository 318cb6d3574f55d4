"""Concurrent SendMessage calls stored together (`broker.grpc.batching.SendBatcher`), against a
real local-mode broker's services (controller, store files in tmp_path): fewer store calls than
callers, every caller gets its own results in order, one caller's refused message fails only that
caller, and a caller without the right is refused before it waits for anyone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest

from broker.config import BrokerConfig
from broker.controller import BrokerController
from broker.errors import BrokerCode, BrokerError
from broker.grpc.batching import SendBatcher
from broker.message import Message
from broker.service import ANONYMOUS, BrokerServices

FILE_BYTES = 64 * 1024


async def _started(tmp_path, **overrides) -> AsyncIterator[BrokerServices]:
    cfg = BrokerConfig(
        store_path_root_dir=str(tmp_path / "store"),
        default_topic_queue_nums=2,
        mapped_file_size_commit_log=FILE_BYTES,
        **overrides,
    )
    controller = BrokerController(cfg)
    svc = BrokerServices.create(controller)
    await controller.start()
    try:
        yield svc
    finally:
        await controller.shutdown()


@pytest.fixture
async def services(tmp_path) -> AsyncIterator[BrokerServices]:
    async for svc in _started(tmp_path):
        yield svc


def _msgs(caller: int, n: int = 2, size: int = 10) -> list[Message]:
    return [Message("t", f"{caller}-{i}".encode().ljust(size, b".")) for i in range(n)]


async def test_concurrent_sends_share_store_calls_and_keep_their_order(services: BrokerServices) -> None:
    batcher = SendBatcher(services.produce)
    results = await asyncio.gather(*(batcher.send(ANONYMOUS, "t", _msgs(c)) for c in range(20)))
    # All 20 arrive before the store call starts: one store call for the 40 messages.
    assert batcher.batches == 1
    for c, res in enumerate(results):
        assert len(res) == 2
        got = [services.query.by_id(ANONYMOUS, r.msg_id).body for r in res]
        assert got == [m.body for m in _msgs(c)]
        assert res[0].queue_id == res[1].queue_id and res[1].queue_offset == res[0].queue_offset + 1
    assert len({(r.queue_id, r.queue_offset) for res in results for r in res}) == 40


async def test_one_callers_refused_message_fails_that_caller_only(services: BrokerServices) -> None:
    batcher = SendBatcher(services.produce)
    too_big = [Message("t", b"x" * FILE_BYTES)]  # larger than a commit-log file: 413
    calls = [batcher.send(ANONYMOUS, "t", _msgs(0))]
    calls += [batcher.send(ANONYMOUS, "t", _msgs(1)), batcher.send(ANONYMOUS, "t", too_big)]
    calls += [batcher.send(ANONYMOUS, "t", _msgs(3))]
    first, second, refused, fourth = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(refused, BrokerError) and refused.code == BrokerCode.MESSAGE_TOO_LARGE
    for c, res in ((0, first), (1, second), (3, fourth)):
        assert not isinstance(res, BaseException), res
        assert [services.query.by_id(ANONYMOUS, r.msg_id).body for r in res] == [m.body for m in _msgs(c)]


async def test_a_caller_without_the_right_is_refused_before_it_waits(tmp_path) -> None:
    acl_file = tmp_path / "acl.json"
    acl_file.write_bytes(
        orjson.dumps({"accounts": [{"name": "app", "token": "tok", "topicPerms": {"t": "SUB"}}]})
    )
    async for svc in _started(tmp_path, acl_enable=True, acl_config_file=str(acl_file)):
        batcher = SendBatcher(svc.produce)
        account = svc.acl.authenticate("Bearer tok")
        with pytest.raises(BrokerError) as err:
            await batcher.send(account, "t", _msgs(0))
        assert err.value.code == BrokerCode.FORBIDDEN and batcher.batches == 0
