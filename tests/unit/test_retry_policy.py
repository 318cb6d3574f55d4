"""Per-group redelivery backoff with RocketMQ 5's defaults."""

import pytest

from broker.retry_policy import RetryPolicy, RetryPolicyError, RetryPolicyType


def test_customized_default_is_level_three_plus_reconsume_times():
    p = RetryPolicy()
    assert [p.delay_ms(n) for n in range(4)] == [10_000, 30_000, 60_000, 120_000]
    assert p.delay_ms(15) == 7_200_000 and p.delay_ms(100) == 7_200_000


def test_exponential_defaults():
    p = RetryPolicy(RetryPolicyType.EXPONENTIAL)
    assert [p.delay_ms(n) for n in range(4)] == [5_000, 10_000, 20_000, 40_000]
    assert p.delay_ms(20) == 7_200_000 and p.delay_ms(10_000) == 7_200_000


def test_wire_form_round_trips_and_validates():
    exponential = RetryPolicy(RetryPolicyType.EXPONENTIAL, initial_ms=100, max_ms=1000, multiplier=3)
    for p in (RetryPolicy(), exponential):
        assert RetryPolicy.from_dict(p.to_dict()) == p
    assert RetryPolicy.from_dict({"type": "customized", "nextMs": [1, 2]}).delay_ms(0) == 2
    bad = [{"type": "LINEAR"}, {"nextMs": []}, {"nextMs": [-1]}, {"type": "EXPONENTIAL", "maxMs": 1},
           {"type": "EXPONENTIAL", "multiplier": 0.5}, {"what": 1}, []]
    for doc in bad:
        with pytest.raises(RetryPolicyError):
            RetryPolicy.from_dict(doc)
