"""Finding answered requests on a real Redis: at intake with the delivery count (one
script call per fetch), and at launch only for items not looked for recently."""

from __future__ import annotations

import time

import redis.asyncio

from plaza.client import make_request
from plaza.settings import PlazaSettings
from plaza.workers.answered import RECHECK_AFTER_S, AnsweredCheck
from plaza.workers.deliveries import DeliveryCounter
from plaza.workers.runner import WorkItem


async def test_the_count_also_looks_for_answers(
    settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    names = settings.names
    counter = DeliveryCounter(redis_client, names, ttl_s=60)
    records = [("topic", 0, offset) for offset in range(4)]
    await redis_client.set(names.result_key("answered"), b"x")
    keys = [names.result_key("answered"), names.result_key("open"), None, None]
    counts, answered = await counter.count_and_look(records, keys)
    assert counts == [1, 1, 1, 1]
    assert answered == [True, False, None, None]  # None: not looked for
    counts, answered = await counter.count_and_look(records[2:], [None, keys[0]])
    assert counts == [2, 2]
    assert answered == [None, True]
    assert await counter.count(records[:1]) == [2]


def _item(rid: str, looked_at: float | None) -> WorkItem:
    return WorkItem(
        request=make_request("identity", {}, correlation_id=rid),
        rows=1,
        version=1,
        looked_at=looked_at,
    )


async def test_the_launch_look_skips_items_looked_for_recently(
    settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    names = settings.names
    check = AnsweredCheck(redis_client, names)
    now = time.monotonic()
    for rid in ("fresh", "stale", "never"):
        await redis_client.set(names.result_key(rid), b"answered after intake looked")
    fresh = _item("fresh", now)
    # Looked for at intake a moment ago: trusted, no look of its own (so it runs).
    assert await check.split([fresh], now) == ([fresh], [])
    # Once one item needs a look, the batch is looked at whole.
    stale = _item("stale", now - 2 * RECHECK_AFTER_S)
    never = _item("never", None)
    kept = _item("kept", None)
    run, answered = await check.split([fresh, stale, never, kept], now)
    assert run == [kept]
    assert answered == [fresh, stale, never]
