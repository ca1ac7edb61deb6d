"""The statistics flush's bookkeeping without Redis: ``FlushLog`` and the flusher's marker."""

from __future__ import annotations

from redis.crc import key_slot

from plaza.naming import Names
from plaza.statistics import MAX_UNCONFIRMED_FLUSHES, FlushLog, flusher_key

KEY = "p:stats:{m}:1"


def totals(success: int, last: int = 0) -> dict[str, dict[str, int]]:
    return {KEY: {"success.count": success, "last_inference": last}}


def test_each_flush_is_the_change_since_the_one_before() -> None:
    log = FlushLog(flusher="f")
    log.add(totals(2, last=7))
    log.add(totals(5, last=9))
    assert log.unconfirmed == [
        (1, [(KEY, 7, {"success.count": 2})]),
        (2, [(KEY, 9, {"success.count": 3})]),
    ]
    keys, args = log.arguments("marker", ttl_s=60)
    assert keys == [KEY, "marker"]
    assert args == [60, 2, 1, 1, 1, 7, 1, "success.count", 2, 2, 1, 1, 9, 1, "success.count", 3]


def test_a_reply_confirms_only_the_flushes_its_call_carried() -> None:
    log = FlushLog()
    log.add(totals(1))
    carried = log.seq
    log.add(totals(4))  # a flush made while that call was out
    log.confirmed(carried)
    assert [seq for seq, _ in log.unconfirmed] == [2]
    log.confirmed(2)
    assert log.unconfirmed == []
    log.add(totals(4))
    assert log.unconfirmed == [(3, [(KEY, 0, {})])]  # nothing new, the hashes' TTL renewed


def test_the_unconfirmed_flushes_are_bounded_and_what_waits_is_carried_later() -> None:
    log = FlushLog()
    for n in range(1, MAX_UNCONFIRMED_FLUSHES + 4):
        log.add(totals(n))
    assert len(log.unconfirmed) == MAX_UNCONFIRMED_FLUSHES
    assert sum(c[0][2]["success.count"] for _, c in log.unconfirmed) == MAX_UNCONFIRMED_FLUSHES
    log.confirmed(log.seq)
    log.add(totals(MAX_UNCONFIRMED_FLUSHES + 3))
    ((_, ((_, _, delta),)),) = log.unconfirmed
    assert delta == {"success.count": 3}


def test_flushers_differ_and_their_marker_shares_the_models_slot() -> None:
    assert FlushLog().flusher != FlushLog().flusher
    for names in (Names(), Names(key_prefix="t1234abcd:")):
        marker = flusher_key(names, "minilm.v2", FlushLog().flusher)
        assert key_slot(marker.encode()) == key_slot(
            names.model_stats_key("minilm.v2", "1").encode()
        )
        assert marker not in {names.model_stats_key("minilm.v2", v) for v in ("1", "2", "")}
