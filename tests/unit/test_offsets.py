"""Committable offsets when records finish out of order."""

from __future__ import annotations

from plaza.workers.offsets import OffsetTracker


def test_commit_stops_at_the_oldest_unfinished_record() -> None:
    t = OffsetTracker()
    for off in range(10, 15):
        t.started("p0", off)
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


def test_partitions_are_independent_and_forgettable() -> None:
    t = OffsetTracker()
    t.started("a", 0)
    t.started("b", 5)
    t.done("b", 5)
    assert t.to_commit() == {"b": 6}
    t.forget(["a"])
    t.done("a", 0)  # late completion for a revoked partition is ignored
    assert "a" not in t.to_commit() and t.outstanding("a") == 0
