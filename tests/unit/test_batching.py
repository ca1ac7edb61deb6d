"""The dynamic batcher, driven by a fake clock: Triton's semantics sized by queue depth."""

from __future__ import annotations

import weakref

import pytest

from plaza.batching import BatchingPolicy, DynamicBatcher
from plaza.errors import QueueFull
from plaza.modelconfig import QueuePolicy


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def advance(self, us: float) -> None:
        self.t += us / 1e6


def make(clock: FakeClock, **kw) -> DynamicBatcher[int]:
    policy = BatchingPolicy(**{"max_batch_size": 8, "max_queue_delay_us": 1000, **kw})
    return DynamicBatcher(policy, clock=clock)


def test_waits_for_the_delay_then_runs_what_is_there() -> None:
    clock = FakeClock()
    b = make(clock)
    for i in range(3):
        b.add(i)
    d = b.decide()
    assert d.batch == [] and d.wake_at == pytest.approx(clock.t + 0.001)
    clock.advance(990)
    assert b.decide().batch == []
    clock.advance(20)  # now past the oldest request's max_queue_delay
    assert b.decide().batch == [0, 1, 2]
    assert len(b) == 0


def test_the_delay_counts_from_the_arrival_given() -> None:
    clock = FakeClock()
    b = make(clock)
    b.add(0, arrival=clock.t - 0.0006)  # waited 600 us already (in Kafka)
    d = b.decide()
    assert d.batch == [] and d.wake_at == pytest.approx(clock.t + 0.0004)
    clock.advance(410)
    assert b.decide().batch == [0]


def test_an_arrival_in_the_future_counts_as_now() -> None:
    clock = FakeClock()
    b = make(clock)
    b.add(0, arrival=clock.t + 5.0)
    assert b.decide().wake_at == pytest.approx(clock.t + 0.001)


def test_full_batch_runs_at_once() -> None:
    clock = FakeClock()
    b = make(clock)
    for i in range(11):
        b.add(i)
    assert b.decide().batch == list(range(8))
    assert len(b) == 3


def test_preferred_size_runs_at_once_when_depth_reaches_no_further() -> None:
    clock = FakeClock()
    b = make(clock, preferred_batch_sizes=(4,))
    for i in range(5):
        b.add(i)
    assert b.decide(backlog=0).batch == [0, 1, 2, 3]  # depth 5: 4 is the best it can do


def test_deep_queue_waits_for_records_still_in_kafka() -> None:
    clock = FakeClock()
    b = make(clock)
    for i in range(5):
        b.add(i)
    # 5 pending + 10 lagging in Kafka: depth 15 can fill max_batch_size 8, so wait for them
    assert b.decide(backlog=10).batch == []
    for i in range(5, 8):
        b.add(i)
    assert b.decide(backlog=7).batch == list(range(8))


def test_deep_queue_waits_for_the_largest_preferred_size_it_can_fill() -> None:
    clock = FakeClock()
    b = make(clock, preferred_batch_sizes=(2, 4))
    for i in range(3):
        b.add(i)
    # 3 pending + 10 in Kafka: depth 13 can fill 4 (the largest preferred), so wait for it
    assert b.decide(backlog=10).batch == []
    b.add(3)
    assert b.decide(backlog=9).batch == [0, 1, 2, 3]


def test_with_preferred_sizes_a_full_queue_runs_the_largest_preferred_not_the_max() -> None:
    # Triton's rule: max_batch_size is the cap, not a goal, once preferred sizes are named
    clock = FakeClock()
    b = make(clock, max_batch_size=8, preferred_batch_sizes=(2, 4))
    for i in range(8):
        b.add(i)
    assert b.decide(backlog=0).batch == [0, 1, 2, 3]
    assert b.decide(backlog=0).batch == [4, 5, 6, 7]  # the rest is the next batch


def test_deep_queue_never_waits_past_the_delay() -> None:
    clock = FakeClock()
    b = make(clock)
    for i in range(5):
        b.add(i)
    clock.advance(1000)
    assert b.decide(backlog=100).batch == [0, 1, 2, 3, 4]


def test_past_the_delay_the_preferred_size_goes_first_and_the_rest_at_once() -> None:
    clock = FakeClock()
    b = make(clock, preferred_batch_sizes=(4,))
    for i in range(5):
        b.add(i)
    clock.advance(1000)
    assert b.decide(backlog=100).batch == [0, 1, 2, 3]
    assert b.decide(backlog=100).batch == [4]  # due too: it does not wait for more


def test_zero_delay_runs_immediately() -> None:
    clock = FakeClock()
    b = make(clock, max_queue_delay_us=0)
    b.add(1)
    assert b.decide(backlog=50).batch == [1]


def test_request_rows_count_toward_the_batch() -> None:
    clock = FakeClock()
    b = make(clock)
    b.add("a", size=5)
    b.add("b", size=4)  # would make 9 > 8
    assert b.decide().batch == ["a"]
    assert b.pending_size == 4


def test_no_dynamic_batching_runs_one_request_at_a_time() -> None:
    clock = FakeClock()
    b = make(clock, enabled=False)
    for i in range(3):
        b.add(i)
    assert b.decide().batch == [0]
    assert b.decide().batch == [1]


def test_higher_priority_is_batched_first() -> None:
    clock = FakeClock()
    b = make(clock, priority_levels=2, default_priority_level=2, max_batch_size=4)
    for i in range(4):
        b.add(f"low{i}", priority=2)
    b.add("high0", priority=1)
    b.add("default", priority=0)  # -> level 2
    first = b.decide().batch
    assert first == ["high0", "low0", "low1", "low2"]
    assert b.level_depths() == {1: 0, 2: 2}


def test_reject_on_timeout_expires_before_running() -> None:
    clock = FakeClock()
    b = make(clock, default_queue_policy=QueuePolicy(default_timeout_us=500))
    b.add("old")
    clock.advance(300)
    b.add("young")
    clock.advance(300)  # old is 600us old (deadline 500), young 300us
    d = b.decide()
    assert d.expired == ["old"] and d.batch == []
    assert d.wake_at == pytest.approx(clock.t + 0.0002)  # young's own deadline comes first


def test_request_deadline_can_only_lower_the_configured_timeout() -> None:
    clock = FakeClock()
    overridable = QueuePolicy(default_timeout_us=1000, allow_timeout_override=True)
    b = make(clock, max_queue_delay_us=10_000, default_queue_policy=overridable)
    b.add("asks-more", deadline=clock.t + 1.0)
    b.add("asks-less", deadline=clock.t + 0.0002)
    clock.advance(300)
    assert b.decide().expired == ["asks-less"]
    clock.advance(800)
    assert b.decide().expired == ["asks-more"]


def test_delay_action_keeps_the_request_behind_others() -> None:
    clock = FakeClock()
    b = make(
        clock,
        max_batch_size=2,
        default_queue_policy=QueuePolicy(reject_on_timeout=False, default_timeout_us=100),
    )
    b.add("late")
    clock.advance(200)
    b.add("fresh1")
    b.add("fresh2")
    d = b.decide()
    assert d.expired == [] and d.batch == ["fresh1", "fresh2"]
    clock.advance(1000)
    assert b.decide().batch == ["late"]


def test_max_queue_size_raises_queue_full() -> None:
    clock = FakeClock()
    b = make(clock, default_queue_policy=QueuePolicy(max_queue_size=2))
    b.add(1)
    b.add(2)
    with pytest.raises(QueueFull) as info:
        b.add(3)
    assert info.value.retriable and info.value.code == "queue_full"


def test_a_full_level_runs_at_once_instead_of_waiting_its_delay() -> None:
    """max_queue_size 2 under max_batch_size 8: nothing more joins a level holding 2 (refused
    here, not fetched by a worker), so waiting the delay would fill nothing."""
    clock = FakeClock()
    b = make(clock, default_queue_policy=QueuePolicy(max_queue_size=2))
    b.add(1)
    assert b.decide().batch == []  # room left: it waits for more
    b.add(2)
    assert b.decide().batch == [1, 2]


@pytest.mark.parametrize("leave", ["expire", "remove"])
def test_requests_gone_from_behind_a_live_one_free_their_places(leave: str) -> None:
    # max_queue_size counts the requests waiting (Triton's rule), not the husks that expired
    # or revoked ones leave in the deque behind a live head
    clock = FakeClock()
    qp = QueuePolicy(max_queue_size=4, default_timeout_us=1_000_000, allow_timeout_override=True)
    b = make(clock, max_queue_delay_us=100_000, default_queue_policy=qp)
    b.add("A")  # no deadline of its own (the level's 1 s): stays at the head
    for x in "BCD":
        b.add(x, deadline=clock.t + 0.01)
    if leave == "expire":
        clock.advance(20_000)
        d = b.decide()
        assert d.expired == ["B", "C", "D"] and d.batch == []
    else:
        assert b.remove_if(lambda x: x != "A") == ["B", "C", "D"]
    assert len(b) == 1 and b.level_depths() == {0: 1}
    for x in "EFG":
        b.add(x)
    with pytest.raises(QueueFull):
        b.add("H")
    assert b.level_depths() == {0: 4}


def test_level_depths_follow_requests_taken_delayed_and_refused() -> None:
    clock = FakeClock()
    delay = QueuePolicy(max_queue_size=3, reject_on_timeout=False, default_timeout_us=100)
    b = make(
        clock,
        max_batch_size=2,
        priority_levels=2,
        default_priority_level=2,
        priority_queue_policy={2: delay},
    )

    def depths() -> dict[int, int]:
        got = b.level_depths()
        assert sum(got.values()) == len(b)
        return got

    b.add("late", priority=2)
    clock.advance(200)  # late's timeout passes: DELAY moves it behind the others
    b.add("f1", priority=2)
    b.add("f2", priority=2)
    b.add("high", priority=1)  # level 1 has no limit and its own count
    assert b.decide().batch == ["high", "f1"]
    assert depths() == {1: 0, 2: 2}  # f2, and late: delayed, still waiting at level 2
    b.add("g1", priority=2)
    with pytest.raises(QueueFull):  # the delayed request holds one of the 3 places
        b.add("g2", priority=2)
    assert depths() == {1: 0, 2: 3}
    assert b.decide().batch == ["f2", "g1"]
    assert depths() == {1: 0, 2: 1}
    b.add("g2", priority=2)
    b.add("g3", priority=2)
    assert depths() == {1: 0, 2: 3}
    clock.advance(1000)  # g2 and g3 are delayed too, behind late
    assert b.decide().batch == ["late", "g2"]
    assert b.decide().batch == ["g3"]
    assert depths() == {1: 0, 2: 0}
    for x in ("h1", "h2", "h3"):
        b.add(x, priority=2)
    with pytest.raises(QueueFull):
        b.add("h4", priority=2)


def test_remove_if_drops_revoked_requests() -> None:
    clock = FakeClock()
    b = make(clock)
    for i in range(6):
        b.add(i)
    assert b.remove_if(lambda i: i % 2 == 0) == [0, 2, 4]
    clock.advance(1000)
    assert b.decide().batch == [1, 3, 5]


def test_empty_batcher_sleeps_until_something_arrives() -> None:
    d = make(FakeClock()).decide(backlog=0)
    assert d.batch == [] and d.expired == [] and d.wake_at is None


class Payload:
    """A stand-in for a request's payload, so the test can see whether it is still alive."""


def retained_entries(b: DynamicBatcher[Payload]) -> int:
    """Entries the batcher still holds anywhere: queues, delayed queues, deadline heap."""
    queued = sum(len(q) for q in b._order)
    return queued + len(b._deadlines)


def test_husks_behind_live_entries_are_dropped_once_they_are_most_of_the_queue() -> None:
    clock = FakeClock()
    b: DynamicBatcher[Payload] = DynamicBatcher(BatchingPolicy(max_batch_size=8), clock=clock)
    payloads = [Payload() for _ in range(300)]
    for p in payloads:
        b.add(p)
    keep = set(map(id, payloads[::3]))
    b.remove_if(lambda p: id(p) not in keep)  # two in three revoked, most behind a live one
    assert len(b) == 100 and retained_entries(b) == 100
    b.remove_if(lambda p: p is payloads[3])  # one husk behind the head: it may wait
    assert len(b) == 99 and retained_entries(b) == 100


def test_served_requests_are_released_at_once_despite_long_deadlines() -> None:
    clock = FakeClock()
    hours = QueuePolicy(default_timeout_us=7200 * 10**6, allow_timeout_override=True)
    b: DynamicBatcher[Payload] = DynamicBatcher(
        BatchingPolicy(max_batch_size=8, max_queue_delay_us=1000, default_queue_policy=hours),
        clock=clock,
    )
    alive: weakref.WeakSet[Payload] = weakref.WeakSet()
    worst = 0
    for round_ in range(100_000 // 8):
        for _ in range(8 + round_ % 3):  # a few stay pending each round, then drain
            payload = Payload()
            alive.add(payload)
            b.add(payload, deadline=clock.t + 3600.0)
            del payload
        served = b.decide().batch
        assert served and len(served) <= 8
        del served
        clock.advance(10)
        worst = max(worst, retained_entries(b) - 3 * len(b))
        assert len(alive) == len(b), f"round {round_}: {len(alive)} payloads, {len(b)} pending"
        if len(b) > 64:  # keep the pending count moderate so the bound stays meaningful
            clock.advance(1000)
            while len(b):
                b.decide()
    assert worst <= 2 * 64, f"batcher kept {worst} entries beyond its pending requests"
