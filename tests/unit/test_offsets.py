"""Committable offsets when records finish out of order, for owned partitions only."""

from __future__ import annotations

from typing import cast

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition

from plaza.workers.offsets import OffsetTracker, follow_positions


def tracker(*partitions: str) -> OffsetTracker:
    t = OffsetTracker()
    t.assign(partitions)
    return t


def test_commit_stops_at_the_oldest_unfinished_record() -> None:
    t = tracker("p0")
    for off in range(10, 15):
        assert t.started("p0", off)
    t.done("p0", 12)
    t.done("p0", 13)
    assert t.to_commit() == {}  # 10 is still outstanding
    t.done("p0", 10)
    assert t.to_commit() == {"p0": 11}
    t.committed({"p0": 11})
    t.done("p0", 11)
    t.done("p0", 14)
    assert t.to_commit() == {"p0": 15}
    t.committed({"p0": 15})
    assert t.to_commit() == {} and t.outstanding() == 0


def test_an_assigned_partition_without_records_commits_nothing() -> None:
    t = tracker("p0", "p1")
    t.started("p1", 3)
    t.done("p1", 3)
    assert t.to_commit() == {"p1": 4}


def test_partitions_are_independent_and_forgettable() -> None:
    t = tracker("a", "b")
    t.started("a", 0)
    t.started("b", 5)
    t.done("b", 5)
    assert t.to_commit() == {"b": 6}
    t.forget(["a"])
    t.done("a", 0)  # late completion for a revoked partition is ignored
    assert "a" not in t.to_commit() and t.outstanding("a") == 0


def test_a_record_taken_after_its_partition_was_revoked_never_reaches_a_commit() -> None:
    """The rest of a fetch, taken in after a revocation (a dead-letter send was in flight):
    recreating the partition would put it into every later commit, and Kafka refuses a
    commit naming a partition the consumer does not own, all of it."""
    t = tracker("a", "b")
    t.started("a", 0)
    t.started("b", 0)
    t.forget(["a", "b"])  # the rebalance revoked both ...
    t.assign(["b"])  # ... and gave back only b
    assert not t.started("a", 1)  # refused: a belongs to its next owner
    assert t.started("b", 7)
    t.done("a", 1)
    t.done("b", 7)
    assert t.to_commit() == {"b": 8}
    assert not t.owns("a") and t.outstanding() == 0


def test_assign_keeps_the_progress_of_partitions_already_owned() -> None:
    t = tracker("a")
    t.started("a", 4)
    t.assign(["a", "b"])  # an incremental assignment adds b; a keeps its outstanding 4
    assert t.outstanding("a") == 1
    t.done("a", 4)
    assert t.to_commit() == {"a": 5}


class _Revoking:
    """A consumer as aiokafka's is while a partition is revoked: still assigned, its
    position past the fetch the worker refused (records 10..19, for the next owner)."""

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp

    def assignment(self) -> set[TopicPartition]:
        return {self.tp}

    def highwater(self, tp: TopicPartition) -> int:
        return 20

    async def position(self, tp: TopicPartition) -> int:
        return 20


async def test_a_partition_being_revoked_does_not_commit_past_the_records_it_refused() -> None:
    tp = TopicPartition("t", 0)
    t = OffsetTracker()
    t.assign([tp])
    for off in range(10):  # answered; 10..19 were fetched, then refused as tp was revoked
        t.started(tp, off)
        t.done(tp, off)
    t.committed({tp: 10})
    consumer = cast(AIOKafkaConsumer, _Revoking(tp))
    assert not await follow_positions(consumer, t, leaving={tp})
    assert t.to_commit() == {}  # the next owner runs 10..19
    assert await follow_positions(consumer, t)  # not revoked: past markers, to the position
    assert t.to_commit() == {tp: 20}
