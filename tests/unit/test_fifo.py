"""FIFO: RocketMQ's queue choice for a message group, and the per-group "next only after settle" gate."""

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.fifo import FifoGate, message_group_problem
from wire.groups import consistent_hash, queue_of_group


def test_guava_consistent_hash_golden_values():
    # Guava's HashingTest (compatibility with the C++ jump hash) — RocketMQ's proxy uses this function
    assert [consistent_hash(i, 100) for i in range(1, 6)] == [55, 62, 8, 45, 59]


def test_consistent_hash_moves_a_value_only_to_a_new_bucket():
    for value in (-1, 0, 1, 2, 2**63 - 1, -(2**63), 7_919, -123_456_789):
        last = 0
        for n in range(1, 2000):
            b = consistent_hash(value, n)
            assert 0 <= b < n
            if b != last:
                assert b == n - 1  # Guava's correctness property
                last = b


def test_queue_of_group_is_java_string_hash_then_jump_hash():
    assert queue_of_group("order-1", 8) == consistent_hash(-1_207_111_310, 8)  # "order-1".hashCode() in Java
    groups = [f"g{i}" for i in range(2000)]
    counts = [0] * 8
    for g in groups:
        counts[queue_of_group(g, 8)] += 1
    assert min(counts) > 150  # spread over every queue
    assert all(queue_of_group(g, 8) == queue_of_group(g, 8) for g in groups)


def test_message_group_rules():
    assert message_group_problem("order-42") is None
    for bad in ("", None, 5, "x" * 65, "a\nb", "é" * 33):
        assert message_group_problem(bad) is not None


def test_gate_blocks_a_group_until_its_head_settles_others_go_on():
    gate = FifoGate()
    assert gate.admit(0, "A") and gate.admit(1, "B")
    assert not gate.admit(2, "A") and not gate.admit(3, "A")
    assert gate.admit(4, "C")
    assert gate.take_ready(10) == []
    gate.settle(0)
    assert gate.take_ready(10) == [2]
    assert gate.low_water_mark(5) == 1
    gate.settle(1)
    gate.settle(2)
    assert gate.take_ready(10) == [3]
    gate.settle(4)
    gate.settle(3)
    assert gate.low_water_mark(5) == 5 and gate.held == 0


def test_gate_caps_what_it_holds():
    gate = FifoGate(max_held=2)
    gate.admit(0, "A")
    gate.admit(1, "A")
    assert gate.can_read_more()
    gate.admit(2, "A")
    assert not gate.can_read_more()


@settings(max_examples=150, deadline=None)
@given(groups=st.lists(st.sampled_from("ABCD"), min_size=1, max_size=40), data=st.data())
def test_gate_hands_out_each_group_in_order_one_at_a_time(groups, data):
    gate = FifoGate()
    outstanding: dict[str, int] = {}
    delivered: dict[str, list[int]] = {}
    read = 0
    while read < len(groups) or outstanding:
        if read < len(groups) and (not outstanding or data.draw(st.booleans())):
            if gate.admit(read, groups[read]):
                assert groups[read] not in outstanding
                outstanding[groups[read]] = read
                delivered.setdefault(groups[read], []).append(read)
            read += 1
            continue
        if outstanding:
            g = data.draw(st.sampled_from(sorted(outstanding)))
            gate.settle(outstanding.pop(g))
            for off in gate.take_ready(100):
                assert groups[off] not in outstanding
                outstanding[groups[off]] = off
                delivered.setdefault(groups[off], []).append(off)
    for g, offs in delivered.items():
        assert offs == [i for i, x in enumerate(groups) if x == g]
