"""Queue-policy timeouts as Triton's code has them (core ``scheduler_utils.cc``):
``allow_timeout_override``, no timeout where the level has none, and DELAY per level.
Pure logic, driven by a fake clock; the SDK's request timeout of 0 too."""

from __future__ import annotations

import pytest

from plaza.batching import BatchingPolicy, DynamicBatcher, queue_deadline
from plaza.client import make_request
from plaza.modelconfig import QueuePolicy


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def advance(self, us: float) -> None:
        self.t += us / 1e6


def one_level(
    clock: FakeClock, qp: QueuePolicy, max_batch_size: int = 8, max_queue_delay_us: int = 100_000
) -> DynamicBatcher[str]:
    policy = BatchingPolicy(
        max_batch_size=max_batch_size,
        max_queue_delay_us=max_queue_delay_us,
        default_queue_policy=qp,
    )
    return DynamicBatcher(policy, clock=clock)


@pytest.mark.parametrize(
    ("qp", "deadline", "expected"),
    [
        (QueuePolicy(), None, None),
        (QueuePolicy(), 5.0, None),  # no level timeout: nothing to lower
        (QueuePolicy(allow_timeout_override=True), 5.0, None),  # Triton: override < 0, never
        (QueuePolicy(default_timeout_us=2_000_000), None, 3.0),
        (QueuePolicy(default_timeout_us=2_000_000), 1.5, 3.0),  # no override allowed
        (QueuePolicy(default_timeout_us=2_000_000, allow_timeout_override=True), 1.5, 1.5),
        (QueuePolicy(default_timeout_us=2_000_000, allow_timeout_override=True), 9.0, 3.0),
        (QueuePolicy(), 0.5, 0.5),  # passed before intake: at once, whatever the policy
        (QueuePolicy(default_timeout_us=2_000_000), 1.0, 1.0),
    ],
)
def test_queue_deadline_is_tritons_enqueue_rule(
    qp: QueuePolicy, deadline: float | None, expected: float | None
) -> None:
    assert queue_deadline(qp, deadline, now=1.0) == expected


def test_without_allow_timeout_override_a_request_timeout_leaves_the_level_timeout() -> None:
    clock = FakeClock()
    b = one_level(clock, QueuePolicy(default_timeout_us=10_000))
    b.add("asks-less", deadline=clock.t + 0.001)
    clock.advance(5_000)  # past the request's own 1 ms, within the level's 10 ms
    d = b.decide()
    assert d.expired == [] and d.batch == []
    clock.advance(6_000)
    assert b.decide().expired == ["asks-less"]


def test_with_allow_timeout_override_a_request_timeout_lowers_the_level_timeout() -> None:
    clock = FakeClock()
    b = one_level(clock, QueuePolicy(default_timeout_us=10_000, allow_timeout_override=True))
    b.add("asks-less", deadline=clock.t + 0.001)
    b.add("asks-more", deadline=clock.t + 1.0)
    clock.advance(5_000)
    assert b.decide().expired == ["asks-less"]
    clock.advance(6_000)  # the level's 10 ms: a request cannot raise it
    assert b.decide().expired == ["asks-more"]


@pytest.mark.parametrize("allow", [False, True])
def test_where_the_level_has_no_timeout_the_request_timeout_does_not_expire_it(
    allow: bool,
) -> None:
    clock = FakeClock()
    b = one_level(clock, QueuePolicy(allow_timeout_override=allow), max_queue_delay_us=10_000)
    b.add("patient", deadline=clock.t + 0.001)
    clock.advance(5_000)
    d = b.decide()
    assert d.expired == [] and d.batch == [] and d.wake_at == pytest.approx(clock.t + 0.005)
    clock.advance(5_001)  # the queue delay, not the deadline, decides when it runs
    assert b.decide().batch == ["patient"]


@pytest.mark.parametrize(
    "qp",
    [
        QueuePolicy(),
        QueuePolicy(default_timeout_us=10**6),
        QueuePolicy(allow_timeout_override=True),
    ],
)
def test_a_deadline_passed_before_intake_times_out_at_once(qp: QueuePolicy) -> None:
    """Plaza's deadline counts the wait in Kafka: one already passed when the worker takes
    the request in is answered at once (REJECT), whatever the level's timeout."""
    clock = FakeClock()
    b = one_level(clock, qp)
    b.add("late", deadline=clock.t - 0.001)
    b.add("fresh")
    d = b.decide()
    assert d.expired == ["late"] and d.batch == []


def test_a_deadline_passed_before_intake_is_delayed_where_the_level_delays() -> None:
    clock = FakeClock()
    b = one_level(clock, QueuePolicy(reject_on_timeout=False), max_batch_size=1)
    b.add("late", deadline=clock.t - 0.001)
    b.add("fresh")
    clock.advance(100_000)
    assert [b.decide().batch for _ in range(3)] == [["fresh"], ["late"], []]


def levels(clock: FakeClock, delaying: dict[int, QueuePolicy]) -> DynamicBatcher[str]:
    policy = BatchingPolicy(
        max_batch_size=1,
        priority_levels=3,
        default_priority_level=3,
        priority_queue_policy=delaying,
    )
    return DynamicBatcher(policy, clock=clock)


def drain(b: DynamicBatcher[str]) -> list[str]:
    order: list[str] = []
    while len(b):
        d = b.decide()
        assert d.expired == []
        order.extend(d.batch)
    return order


def test_a_delayed_request_waits_only_behind_its_own_and_higher_levels() -> None:
    """Triton's DELAY: behind the non-expired requests at the same (or higher) levels, not
    behind lower levels (Plaza had one delayed queue, served after every level)."""
    clock = FakeClock()
    delay = QueuePolicy(reject_on_timeout=False, default_timeout_us=1000)
    b = levels(clock, {1: delay})
    b.add("high-delayed", priority=1)
    b.add("low-a", priority=2)
    b.add("low-b", priority=3)
    clock.advance(5_000)
    assert drain(b) == ["high-delayed", "low-a", "low-b"]


def test_each_level_serves_its_fresh_requests_then_its_delayed_ones() -> None:
    clock = FakeClock()
    delay = QueuePolicy(reject_on_timeout=False, default_timeout_us=1000)
    b = levels(clock, {1: delay, 2: delay})
    b.add("2-delayed", priority=2)
    b.add("1-delayed", priority=1)
    clock.advance(5_000)  # both time out: the next decide moves them to their delayed queues
    b.add("3-fresh", priority=3)
    b.add("2-fresh", priority=2)
    b.add("1-fresh", priority=1)
    assert drain(b) == ["1-fresh", "1-delayed", "2-fresh", "2-delayed", "3-fresh"]
    assert b.level_depths() == {1: 0, 2: 0, 3: 0}


@pytest.mark.parametrize(("timeout_s", "ms"), [(0.0001, 1), (0.001, 1), (0.0011, 2), (60, 60_000)])
def test_the_sdk_rounds_a_request_timeout_up_to_a_whole_millisecond(
    timeout_s: float, ms: int
) -> None:
    req = make_request("m", (), timeout_s=timeout_s)
    assert req.deadline_ms is not None and req.deadline_ms - req.created_ms == ms


@pytest.mark.parametrize("timeout_s", [0, 0.0, None])
def test_an_sdk_timeout_of_zero_is_no_deadline(timeout_s: float | None) -> None:
    assert make_request("m", (), timeout_s=timeout_s).deadline_ms is None
