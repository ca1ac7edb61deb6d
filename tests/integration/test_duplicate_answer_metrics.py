"""An answer that loses to one stored before it counts no request, on real Kafka and Redis.

A replay's answer (the same request run again after a crash or a rebalance) is suppressed by
the writer (first write wins); the request was counted by the run whose answer the client
got, so success counts each answered request once.
"""

from __future__ import annotations

import numpy as np
import redis.asyncio

from plaza.client import PlazaClient, make_request
from plaza.codec import encode_result
from plaza.contract import InferResult
from plaza.settings import PlazaSettings
from plaza.workers.answered import AnsweredCheck
from plaza.workers.writer import ResultWriter
from tests.support import gated, running_worker, wait_for


def _answer(rid: str, worker: str) -> InferResult:
    return InferResult(rid, "identity", "1", worker=worker, timing_us={"queue": 1})


async def test_a_suppressed_answer_counts_no_success(settings: PlazaSettings) -> None:
    x = np.full((1, 2), 5, np.float32)
    async with PlazaClient(settings) as client, running_worker(settings, "identity") as worker:
        gate = gated(worker)
        stream = client.results_stream("dup")
        replayed, fresh = (
            make_request("identity", {"INPUT0": x}, reply_stream=stream, correlation_id=rid)
            for rid in ("replayed-id", "fresh-id")
        )
        await client.publish_many([replayed])
        await wait_for(gate.entered.is_set, 30, "the run to begin")
        # Another run of the same request answered while this one ran: the client has that
        # answer, and this run's is suppressed.
        key = settings.names.result_key(replayed.id)
        assert await client._redis.set(key, encode_result(_answer(replayed.id, "earlier")))
        gate.gate.set()
        await wait_for(lambda: worker.metrics.records["duplicate"] == 1, what="the suppressed")
        await client.publish_many([fresh])
        await wait_for(lambda: worker.metrics.records["written"] == 1, what="the fresh answer")
        stats = worker.metrics.version("1")
        assert worker.metrics.executions() == 2  # both ran
        assert stats.success.count == 1  # the fresh one alone: the client got the earlier
        assert stats.fail.count == 0
        assert (await client.result(replayed.id)).worker == "earlier"


async def test_first_writes_tells_which_answers_a_write_stored(
    settings: PlazaSettings, redis_client: redis.asyncio.Redis
) -> None:
    names = settings.names
    small = settings.redis.model_copy(update={"max_result_bytes": 4096})
    writer = ResultWriter(redis_client, small, names)
    check = AnsweredCheck(redis_client, names)
    earlier = _answer("a", "earlier")
    await redis_client.set(names.result_key("a"), encode_result(earlier))
    # "d" is over the limit: the writer stores a payload_too_large error in its place
    big = InferResult("d", "identity", "1", worker="me", parameters={"pad": "x" * 8192})
    mine = [_answer("a", "me"), _answer("b", "me"), _answer("c", "me"), big]

    async def firsts(results: list[InferResult]) -> list[bool]:
        return await check.first_writes(results, await writer.stored_payloads(results))

    try:
        assert await writer.write_until_done([(r, None) for r in mine]) == 3
        assert await firsts(mine) == [False, True, True, True]
        # the same write again (its reply lost): its answers are still the stored ones
        assert await writer.write_until_done([(r, None) for r in mine[1:]]) == 0
        assert await firsts(mine[1:]) == [True, True, True]
    finally:
        await writer.close()
