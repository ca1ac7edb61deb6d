"""The queue delay counts from the oldest pending request, whatever order it came in.

A level's queue is in the order the worker fetched its requests (grouped by partition), but
a request arrives when it was sent (``worker.queue_delay_from``): one sent earlier may sit
behind a newer one, and its delay must not be counted from that newer head.
"""

from __future__ import annotations

from typing import Any

import pytest

from plaza.batching import BatchingPolicy, DynamicBatcher
from plaza.modelconfig import QueuePolicy
from tests.fakes import ManualClock

DELAY_US = 2_000_000


def make(clock: ManualClock, **kw: Any) -> DynamicBatcher[str]:
    policy = BatchingPolicy(**{"max_batch_size": 8, "max_queue_delay_us": DELAY_US, **kw})
    return DynamicBatcher(policy, clock=clock)


def test_an_older_request_behind_a_newer_one_sets_the_due_time() -> None:
    clock = ManualClock(100.0)
    b = make(clock)
    b.add("new", arrival=100.0)  # fetched first (partition 0), sent just now
    b.add("old", arrival=98.5)  # fetched second (partition 1), sent 1.5 s ago
    d = b.decide()
    assert d.batch == [] and d.wake_at == pytest.approx(100.5)
    clock.now = 100.5
    assert b.decide().batch == ["new", "old"]


def test_the_oldest_across_levels_sets_the_due_time() -> None:
    clock = ManualClock(100.0)
    b = make(clock, priority_levels=2, default_priority_level=2)
    b.add("high", priority=1, arrival=100.0)
    b.add("low", priority=2, arrival=99.0)
    assert b.decide().wake_at == pytest.approx(101.0)
    clock.now = 101.0
    assert b.decide().batch == ["high", "low"]


def test_once_the_oldest_is_served_the_next_oldest_sets_the_due_time() -> None:
    clock = ManualClock(100.0)
    b = make(clock, max_batch_size=2, max_queue_delay_us=1_000_000)
    b.add("old", size=2, arrival=99.0)
    b.add("new", arrival=100.0)
    assert b.decide().batch == ["old"]  # a full batch: new's row does not fit
    d = b.decide()
    assert d.batch == [] and d.wake_at == pytest.approx(101.0)


def test_a_revoked_oldest_request_no_longer_sets_the_due_time() -> None:
    clock = ManualClock(100.0)
    b = make(clock)
    b.add("new", arrival=100.0)
    b.add("old", arrival=98.5)
    assert b.remove_if(lambda item: item == "old") == ["old"]
    assert b.decide().wake_at == pytest.approx(102.0)


def test_a_delayed_request_keeps_its_arrival() -> None:
    clock = ManualClock(100.0)
    delay = QueuePolicy(default_timeout_us=100_000, reject_on_timeout=False)
    b = make(clock, default_queue_policy=delay)
    b.add("old", arrival=99.0)
    clock.now = 100.2  # its queue timeout passed: moved to the delayed queue
    d = b.decide()
    assert d.expired == [] and d.wake_at == pytest.approx(101.0)
    clock.now = 101.0
    assert b.decide().batch == ["old"]


def test_the_arrival_heap_stays_bounded_by_the_pending_requests() -> None:
    clock = ManualClock(100.0)
    b = make(clock, max_queue_delay_us=1000)
    worst = 0
    for round_ in range(5000):
        for i in range(8 + round_ % 3):  # a few stay pending each round, then drain
            b.add(f"{round_}-{i}", arrival=clock.now - (i % 4) * 1e-4)
        assert b.decide().batch
        clock.now += 1e-5
        worst = max(worst, len(b._arrivals) - 2 * len(b))
        if len(b) > 64:
            clock.now += 0.01
            while len(b):
                b.decide()
    assert worst <= 64, f"arrival heap kept {worst} entries beyond twice the pending count"
