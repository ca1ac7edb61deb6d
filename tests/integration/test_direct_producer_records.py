"""Records from producers that publish straight to Kafka: each one whose correlation id can
be read is answered, and none stops the worker (real Kafka and Redis).

A producer of its own writes msgpack maps the gateway never checked. The worker must
answer every such record whose id it can read (the producer polls that id's result key),
dead-letter only those it cannot, and never let one stop its intake: a record that stops
the intake stops every worker that takes its partition next, for good.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack
import numpy as np
import pytest
import redis.asyncio
from aiokafka import AIOKafkaConsumer

from plaza.codec import decode_result, decode_results, entry_count
from plaza.connections import ensure_topics, kafka_producer
from plaza.contract import InferResult
from plaza.settings import PlazaSettings
from plaza.workers.worker import Worker
from tests.support import serving_worker, still_serving, wait_for, with_model

MODEL = "identity"


def body(rid: str | None, **fields: Any) -> dict[str, Any]:
    """A valid identity request as a producer of its own writes it, with ``fields`` set."""
    data = np.arange(3, dtype="<f4").tobytes()
    envelope: dict[str, Any] = {
        "v": 1,
        "id": rid,
        "model": MODEL,
        "version": "",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 3], "data": data}],
    }
    envelope.update(fields)
    return {k: v for k, v in envelope.items() if v is not None}


def nested_past_the_readers(depth: int = 5000) -> bytes:
    """``body("deep")`` with a ``parameters`` map nested ``depth`` maps deep, as its last
    entry: valid msgpack that neither msgspec nor msgpack-python reads to its end."""
    head = msgpack.packb(body("deep"))
    assert head[0] & 0xF0 == 0x80  # a fixmap: its entry count is in its first byte
    deep = b"\x81\xa1a" * depth + b"\xc0"
    return bytes([head[0] + 1]) + head[1:] + msgpack.packb("parameters") + deep


async def publish(settings: PlazaSettings, values: list[bytes]) -> list[int]:
    """``values`` onto partition 0 of MODEL's topic, in order; their offsets."""
    producer = kafka_producer(settings.kafka)
    await producer.start()
    try:
        topic = settings.names.request_topic(MODEL)
        return [(await producer.send_and_wait(topic, v, partition=0)).offset for v in values]
    finally:
        await producer.stop()


async def answers(
    settings: PlazaSettings,
    client: redis.asyncio.Redis,
    watch: asyncio.Task[None],
    ids: list[str],
) -> dict[str, InferResult]:
    """The result stored under each of ``ids``' result keys, once all are there."""
    keys = [settings.names.result_key(rid) for rid in ids]

    async def all_there() -> bool:
        still_serving(watch)
        return bool(await client.exists(*keys) == len(keys))

    await wait_for(all_there, 60, f"answers for {ids}")
    stored = await client.mget(keys)
    return {rid: decode_result(raw) for rid, raw in zip(ids, stored, strict=True)}


def code_of(result: InferResult) -> str:
    return "ok" if result.error is None else result.error.code


@pytest.mark.timeout(120)
async def test_a_redelivered_record_with_a_negative_priority_is_answered_and_the_worker_goes_on(
    settings: PlazaSettings,
    redis_client: redis.asyncio.Redis,  # deletes this test's keys afterwards
) -> None:
    names = settings.names
    topic = names.request_topic(MODEL)
    await ensure_topics(settings.kafka, [topic, names.dead_letter_topic(MODEL)])
    bad, after = await publish(
        settings, [msgpack.packb(body("negative", priority=-1)), msgpack.packb(body("after"))]
    )
    # What a worker that began to run the first record and died before answering leaves
    # behind: its delivery counter at 1, marked running, so the next owner takes it as a
    # suspect (it runs alone).
    key = names.delivery_key(topic, 0, bad)
    await redis_client.hset(key, mapping={"deliveries": 1, "running": 1})
    await redis_client.expire(key, 300)

    async with serving_worker(Worker(with_model(settings, MODEL))) as watch:
        results = await answers(settings, redis_client, watch, ["negative", "after"])
        still_serving(watch)

    negative = results["negative"]
    assert negative.error is not None and negative.error.code == "invalid_input"
    assert "negative" in negative.error.message
    assert code_of(results["after"]) == "ok"
    np.testing.assert_array_equal(results["after"].output("OUTPUT0").to_numpy(), [[0, 1, 2]])
    assert after == bad + 1


@pytest.mark.timeout(150)
async def test_every_record_with_a_readable_id_is_answered_and_only_the_others_dead_lettered(
    settings: PlazaSettings,
    redis_client: redis.asyncio.Redis,  # deletes this test's keys afterwards
) -> None:
    names = settings.names
    await ensure_topics(
        settings.kafka, [names.request_topic(MODEL), names.dead_letter_topic(MODEL)]
    )
    stream = names.results_stream("direct")
    records = {  # id -> (record, the code its answer carries)
        "trailing": (
            msgpack.packb(body("trailing", reply_stream=stream)) + b"\x00",
            "bad_envelope",
        ),
        "int-keys": (msgpack.packb(body("int-keys", parameters={"m": {1: "x"}})), "bad_envelope"),
        "deep": (nested_past_the_readers(), "bad_envelope"),
        "bin-param": (msgpack.packb(body("bin-param", parameters={"k": b"\x01"})), "bad_envelope"),
        "map-param": (msgpack.packb(body("map-param", parameters={"k": {"a": 1}})), "bad_envelope"),
        "outputs-twice": (
            msgpack.packb(body("outputs-twice", outputs=["OUTPUT0", "OUTPUT0"])),
            "invalid_input",
        ),
        "after": (msgpack.packb(body("after", parameters={"k": 1, "f": 0.5, "s": "x"})), "ok"),
    }
    no_id = msgpack.packb(body(None))
    await publish(settings, [no_id, *(record for record, _ in records.values())])

    dead = AIOKafkaConsumer(
        names.dead_letter_topic(MODEL),
        bootstrap_servers=settings.kafka.bootstrap_servers,
        auto_offset_reset="earliest",
        group_id=None,
    )
    await dead.start()
    try:
        async with serving_worker(Worker(with_model(settings, MODEL))) as watch:
            results = await answers(settings, redis_client, watch, list(records))
            letters: list[Any] = []

            async def dead_lettered() -> bool:
                got = await dead.getmany(timeout_ms=500)
                letters.extend(r for rs in got.values() for r in rs)
                return bool(letters)

            await wait_for(dead_lettered, 60, "the record without an id dead-lettered")
            still_serving(watch)
    finally:
        await dead.stop()

    assert {rid: code_of(r) for rid, r in results.items()} == {
        rid: code for rid, (_, code) in records.items()
    }
    bin_error = results["bin-param"].error
    assert bin_error is not None and "parameter 'k'" in bin_error.message
    assert [r.value for r in letters] == [no_id]  # only the record without an id
    assert len(results["after"].outputs) == 1
    # The answer also went to the reply stream the unreadable record named.
    entries = await redis_client.xrange(stream)
    streamed = [
        r.id
        for _, fields in entries
        for r in decode_results(fields[b"r"], entry_count(fields[b"n"]))
    ]
    assert streamed == ["trailing"]
