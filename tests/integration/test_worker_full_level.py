"""A worker whose batcher level is full leaves that level's records in Kafka (real Kafka and
Redis).

``max_queue_size`` is the gateway's bound (the producer core's queue guard); producers that
write to Kafka directly bypass it (docs/guarantees.md). A record in Kafka is accepted: the
worker used to fetch them all and answer those past the bound ``queue_full``. Now a full
level stops the fetching of its topics until the level has room.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import numpy as np
from aiokafka import AIOKafkaProducer

from plaza.client import PlazaClient, make_request
from plaza.codec import encode_request
from plaza.connections import ensure_topics
from plaza.contract import InferRequest
from plaza.settings import PlazaSettings
from tests.support import running_worker

MODEL = "bounded"
REQUESTS = 40
CONFIG = f"""
name: "{MODEL}" backend: "plaza_simulated" max_batch_size: 4
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
dynamic_batching {{
  max_queue_delay_microseconds: 100000
  {{levels}}
}}
parameters [ {{ key: "latency_b_us" value: {{ string_value: "1000" }} }} ]
"""


def bounded_settings(settings: PlazaSettings, tmp_path: Path, levels: str) -> PlazaSettings:
    (tmp_path / MODEL / "1").mkdir(parents=True)
    (tmp_path / MODEL / "config.pbtxt").write_text(CONFIG.replace("{levels}", levels))
    return settings.model_copy(update={"repository": tmp_path})


def rows(count: int, stream: str, levels: int = 1) -> list[InferRequest]:
    """``count`` requests of one row each, answered on ``stream``, their priorities cycling
    through 1..``levels``."""
    return [
        make_request(
            MODEL,
            {"INPUT0": np.full((1, 4), i, np.float32)},
            reply_stream=stream,
            priority=1 + i % levels if levels > 1 else 0,
        )
        for i in range(count)
    ]


async def produce_directly(settings: PlazaSettings, requests: list[InferRequest]) -> None:
    """Write ``requests`` to their topics as a plain Kafka producer would (no queue guard)."""
    topics = {req.id: settings.names.request_topic(MODEL, req.priority) for req in requests}
    await ensure_topics(settings.kafka, sorted(set(topics.values())))
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await producer.start()
    try:
        for req in requests:
            await producer.send(topics[req.id], encode_request(req), key=req.id.encode())
        await producer.flush()
    finally:
        await producer.stop()


async def answer_codes(client: PlazaClient, stream: str, ids: set[str]) -> Counter[str]:
    codes: Counter[str] = Counter()
    seen: set[str] = set()
    async for entry, results in client.consume(stream, "g", "c", block_ms=300):
        for result in results:
            if result.id in ids and result.id not in seen:
                seen.add(result.id)
                codes[result.error.code if result.error else "ok"] += 1
        await client.ack(stream, "g", entry)
        if seen == ids:
            return codes
    raise AssertionError("the stream ended")


async def test_records_past_max_queue_size_wait_in_kafka_not_refused(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    s = bounded_settings(settings, tmp_path, "default_queue_policy { max_queue_size: 5 }")
    async with PlazaClient(s) as client:
        stream = client.results_stream("bounded")
        requests = rows(REQUESTS, stream)
        await produce_directly(s, requests)
        async with running_worker(s, MODEL) as worker:
            codes = await answer_codes(client, stream, {req.id for req in requests})
            assert codes == {"ok": REQUESTS}
            assert worker.metrics.records["rejected"] == 0


async def test_a_bounded_priority_level_waits_in_kafka_beside_an_unbounded_one(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    # level 2 holds 2 at most; level 1 is unbounded. Every record is answered, none refused.
    levels = """
      priority_levels: 2 default_priority_level: 2
      priority_queue_policy { key: 2 value: { max_queue_size: 2 } }
    """
    s = bounded_settings(settings, tmp_path, levels)
    async with PlazaClient(s) as client:
        stream = client.results_stream("levels")
        requests = rows(REQUESTS, stream, levels=2)
        await produce_directly(s, requests)
        async with running_worker(s, MODEL) as worker:
            codes = await answer_codes(client, stream, {req.id for req in requests})
            assert codes == {"ok": REQUESTS}
            assert worker.metrics.records["rejected"] == 0


async def test_a_full_level_runs_what_it_holds_without_waiting_for_rows_left_in_kafka(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    """max_queue_size 2 under max_batch_size 4: the level is full at 2 and intake fetches no
    more, so the batcher must not wait its (here one minute) queue delay for the rows that
    Kafka's lag counts but intake will not bring: each batch of 2 runs at once. Were it
    to wait, the 10 requests would take five minutes; the wait below allows 90 s."""
    levels = "default_queue_policy { max_queue_size: 2 }"
    s = bounded_settings(settings, tmp_path, levels)
    config = tmp_path / MODEL / "config.pbtxt"
    config.write_text(config.read_text().replace("100000", "60000000"))  # one minute
    async with PlazaClient(s) as client:
        stream = client.results_stream("full")
        requests = rows(10, stream)
        await produce_directly(s, requests)
        async with running_worker(s, MODEL):
            answered = answer_codes(client, stream, {req.id for req in requests})
            assert await asyncio.wait_for(answered, 90) == {"ok": 10}
