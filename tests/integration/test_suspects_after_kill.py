"""After a worker is killed, only the records it was running are suspects (real Kafka and
Redis, a worker process killed with SIGKILL).

A record delivered before without an answer may have crashed its worker, so it runs alone on
the next owner (``Worker._try_suspect``). The delivery count goes up at fetch, though: every
record the dead worker had fetched used to come back as a suspect, and a worker killed with
its ``max_pending`` records fetched left them all to run one at a time. Now a batch marks
its records running as it starts (``DeliveryCounter.running``), and only those delivered
before and marked are suspects; the rest are batched as usual.

The victim serves a copy of the model that takes a minute a batch, so at the kill it has
fetched every request and is running its first batch, whatever the machine's speed; the
successor serves a quick copy of it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import redis.asyncio

from plaza.client import PlazaClient, make_request
from plaza.connections import is_cluster
from plaza.connections import redis_client as connect_redis
from plaza.naming import Names
from plaza.settings import PlazaSettings
from plaza.stack import Deployment, ProcessGroup, WorkerProcess, wait_for
from plaza.workers.deliveries import DeliveryCounter
from tests.support import running_worker, short_session

MODEL = "victim"
REQUESTS = 64
MAX_BATCH = 8
CONFIG = f"""
name: "{MODEL}" backend: "plaza_simulated" max_batch_size: {MAX_BATCH}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 0 }}
parameters [ {{ key: "latency_b_us" value: {{ string_value: "{{latency_us}}" }} }} ]
"""


def repository(root: Path, latency_us: int) -> Path:
    (root / MODEL / "1").mkdir(parents=True)
    (root / MODEL / "config.pbtxt").write_text(CONFIG.replace("{latency_us}", str(latency_us)))
    return root


@pytest.mark.timeout(180)
async def test_only_the_batch_running_at_a_kill_runs_alone_after_it(
    kafka_bootstrap: str,
    redis_url: str,
    unique_id: str,
    redis_client: redis.asyncio.Redis,  # deletes this test's keys afterwards
    tmp_path: Path,
) -> None:
    slow = repository(tmp_path / "slow", 60_000_000)
    dep = short_session(Deployment(kafka_bootstrap, redis_url, slow, unique_id, partitions=2))
    settings = dep.settings().model_copy(update={"repository": repository(tmp_path / "quick", 0)})
    counters = f"{dep.key_prefix}deliveries:*"
    procs = ProcessGroup(tmp_path / "logs")
    try:
        async with PlazaClient(settings) as client:
            stream = client.results_stream("suspects")
            requests = [
                make_request(MODEL, {"INPUT0": np.full((1, 4), i, np.float32)}, reply_stream=stream)
                for i in range(REQUESTS)
            ]
            await client.publish_many(requests)
            victim = procs.start(WorkerProcess(dep, MODEL, procs.log_dir))

            async def running() -> int:
                """Records the victim marked running (none answered: a batch takes a
                minute), or 0 until it has fetched every request."""
                keys = [k async for k in redis_client.scan_iter(match=counters, count=1000)]
                if len(keys) < REQUESTS:
                    return 0
                return sum([await redis_client.hexists(k, "running") for k in keys])

            async def fetched_and_running() -> bool:
                procs.check()
                return await running() > 0

            await wait_for(fetched_and_running, 90, "the victim to run a batch", procs.tails)
            victim.kill()  # while its first batch runs
            suspects = await running()

            ids = {req.id for req in requests}
            async with running_worker(settings, MODEL) as successor:
                answered: dict[str, bool] = {}
                async for entry, results in client.consume(stream, "g", "c", block_ms=300):
                    answered.update((r.id, r.error is None) for r in results if r.id in ids)
                    await client.ack(stream, "g", entry)
                    if len(answered) == REQUESTS:
                        break
                sizes = successor.metrics.batch_sizes()
    finally:
        procs.stop_all()
    assert all(answered.values()), answered
    assert sum(size * n for size, n in sizes.items()) == REQUESTS, sizes  # the victim ran none
    # The victim's running batch runs alone, one by one; the others are batched (before
    # the running mark, all 64 ran alone); a batch may hold one request by chance.
    assert 1 <= suspects <= MAX_BATCH
    assert suspects <= sizes.get(1, 0) <= suspects + MAX_BATCH, (suspects, sizes)


async def check_running_marks(client: redis.asyncio.Redis, names: Names) -> None:
    counter = DeliveryCounter(client, names, ttl_s=60)
    records = [("topic", p, o) for p in range(3) for o in range(4)]
    try:
        first = await counter.take(records, [None] * len(records))
        assert first.counts == [1] * 12 and first.ran == [False] * 12
        await counter.running(records[:5])  # a batch of five starts, then its worker dies
        again = await counter.take(records, [None] * len(records))
        assert again.counts == [2] * 12
        assert again.ran == [True] * 5 + [False] * 7
        assert again.suspects() == [2] * 5 + [1] * 7
        counter.finished(records)
        await counter.flush()  # the marks go with the counters: no key left
        for record in records:
            assert await client.exists(names.delivery_key(*record)) == 0
    finally:
        await counter.close()


async def test_the_running_mark_on_a_single_redis(
    settings: PlazaSettings,
    redis_client: redis.asyncio.Redis,  # deletes this test's keys afterwards
) -> None:
    await check_running_marks(redis_client, settings.names)


async def test_the_running_mark_on_a_cluster(cluster_settings: PlazaSettings) -> None:
    client = connect_redis(cluster_settings.redis)
    assert is_cluster(client)
    try:
        await check_running_marks(client, cluster_settings.names)
    finally:
        await client.aclose()
