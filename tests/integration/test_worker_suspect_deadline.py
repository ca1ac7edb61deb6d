"""A redelivered record (a suspect) whose deadline passed is answered with a timeout error,
not run (real Kafka and Redis).

After a worker dies, the records it held come back to the partition's next owner with a
delivery count of 2 or more (``workers/deliveries.py``); they skip the batcher and run
alone, one at a time. Those whose deadline passed meanwhile (during the restart) used to run
and get a success answer; the design answers an expired request with ``timeout`` before it
runs, as the batcher does.
"""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
import redis.asyncio

from plaza.client import make_request
from plaza.codec import decode_result, encode_request
from plaza.connections import ensure_topics, kafka_producer
from plaza.settings import PlazaSettings
from tests.support import running_worker, wait_for

MODEL = "identity"


@pytest.mark.timeout(120)
async def test_an_expired_suspect_is_answered_with_timeout_and_not_run(
    settings: PlazaSettings,
    redis_client: redis.asyncio.Redis,  # deletes this test's keys afterwards
) -> None:
    names = settings.names
    topic = names.request_topic(MODEL)
    await ensure_topics(settings.kafka, [topic, names.dead_letter_topic(MODEL)])
    x = {"INPUT0": np.ones((1, 2), np.float32)}
    late = make_request(MODEL, x, correlation_id="late", timeout_s=600)
    late = msgspec.structs.replace(late, deadline_ms=late.created_ms - 60_000)  # passed
    timely = make_request(MODEL, x, correlation_id="timely", timeout_s=600)
    # Both were delivered once already to a worker that died while running them: the
    # counters such a worker leaves in Redis (its fetch counted them, its batch marked them
    # running), for offsets 0 and 1.
    for offset in (0, 1):
        key = names.delivery_key(topic, 0, offset)
        await redis_client.hset(key, mapping={"deliveries": 1, "running": 1})
        await redis_client.expire(key, 300)
    producer = kafka_producer(settings.kafka)
    await producer.start()
    try:
        for req in (late, timely):
            await producer.send_and_wait(
                topic, encode_request(req), key=req.id.encode(), partition=0
            )
    finally:
        await producer.stop()

    async with running_worker(settings, MODEL) as worker:

        async def answered() -> bool:
            keys = [names.result_key(r.id) for r in (late, timely)]
            return bool(await redis_client.exists(*keys) == 2)

        await wait_for(answered, 60, "both suspects answered")
        executions = worker.metrics.executions()
        expired = worker.metrics.records["expired"]
    results = {}
    for req in (late, timely):
        raw = await redis_client.get(names.result_key(req.id))
        assert isinstance(raw, bytes)
        results[req.id] = decode_result(raw)
    assert results["late"].error is not None and results["late"].error.code == "timeout"
    assert results["timely"].error is None  # a suspect in time still runs
    np.testing.assert_array_equal(results["timely"].output("OUTPUT0").to_numpy(), x["INPUT0"])
    assert expired == 1
    assert executions == 1  # the expired one never ran
