"""The in-flight byte budget (``plaza.producer.InflightBytes``): a request larger than the
whole budget can never fit, so it is refused for good (payload_too_large), not with a
retriable queue_full that no retry would get past."""

from __future__ import annotations

import pytest

from plaza.errors import PayloadTooLarge, QueueFull
from plaza.producer import InflightBytes


def test_a_request_larger_than_the_whole_budget_is_too_large_not_queue_full() -> None:
    budget = InflightBytes(1000)
    with pytest.raises(PayloadTooLarge, match="max_inflight_bytes") as info, budget.hold(1001):
        pass
    assert not isinstance(info.value, QueueFull)
    assert info.value.code == "payload_too_large" and not info.value.retriable
    assert info.value.details["size"] == 1001
    assert budget.used == 0


def test_the_whole_budget_fits_when_nothing_else_is_in_flight() -> None:
    budget = InflightBytes(1000)
    with budget.hold(1000):
        assert budget.used == 1000
        with pytest.raises(QueueFull), budget.hold(1):  # full now, room later: retriable
            pass
    assert budget.used == 0
