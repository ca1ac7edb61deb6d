"""aiokafka's own CPU per record consumed, with the worker's consumer settings.

Goal 3 of issue 12 asks the worker for at most 15 µs of CPU per request on the identity
model. Every request reaches the worker as one Kafka record, so what aiokafka spends to
hand over one record (fetch, decode the batch, make the ConsumerRecord) is a floor under
that figure. This puts N identity request envelopes (plaza.codec, as the SDK publishes them)
on a fresh topic, then reads them back with ``getmany`` as the worker does (its
``fetch_max_records`` per call) and divides this process's CPU by N; then the same records'
``decode_request``, to set the client's share next to the envelope's.

    python scripts/kafka_consume_cost.py --bootstrap-servers 127.0.0.1:29092 [-n 50000]

Loopback only; bounded by N.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import numpy as np
from aiokafka import TopicPartition

from plaza.codec import decode_request, encode_request
from plaza.connections import ensure_topics, kafka_consumer, kafka_producer
from plaza.contract import InferRequest
from plaza.settings import KafkaSettings, WorkerSettings
from plaza.tensors import Tensor


def identity_envelope(i: int) -> bytes:
    """An identity request as the SDK publishes it: one FP32 input of 16 values."""
    data = np.arange(16, dtype=np.float32) + i
    tensor = Tensor("INPUT0", "FP32", (1, 16), data.tobytes())
    request = InferRequest(id=uuid.uuid4().hex, model="identity", version="", inputs=(tensor,))
    return encode_request(request)


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap-servers", default="127.0.0.1:29092")
    p.add_argument("-n", type=int, default=50_000)
    args = p.parse_args()
    k = KafkaSettings(bootstrap_servers=args.bootstrap_servers, partitions=1)
    topic = f"consumecost-{uuid.uuid4().hex[:8]}"
    await ensure_topics(k, [topic])
    envelopes = [identity_envelope(i) for i in range(args.n)]
    producer = kafka_producer(k)
    await producer.start()
    try:
        for start in range(0, args.n, 1000):
            sent = [await producer.send(topic, v) for v in envelopes[start : start + 1000]]
            await asyncio.gather(*sent)
    finally:
        await producer.stop()

    consumer = kafka_consumer(k, f"consumecost-{topic}")
    await consumer.start()
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    await consumer.seek_to_beginning(tp)
    limit = WorkerSettings().fetch_max_records
    got, calls = 0, 0
    values: list[bytes] = []
    cpu0, wall0 = time.process_time(), time.monotonic()
    try:
        while got < args.n:
            fetched = await consumer.getmany(timeout_ms=1000, max_records=limit)
            calls += 1
            for records in fetched.values():
                got += len(records)
                values.extend(r.value for r in records)
    finally:
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        await consumer.stop()
    print(
        f"aiokafka: {cpu / got * 1e6:.1f} us CPU per record consumed ({got} records, "
        f"{calls} getmany calls of up to {limit}, {wall:.1f} s, "
        f"{len(envelopes[0])} bytes each)"
    )
    cpu0 = time.process_time()
    for value in values:
        decode_request(value)
    cpu = time.process_time() - cpu0
    print(f"plaza.codec.decode_request: {cpu / len(values) * 1e6:.1f} us per envelope")


if __name__ == "__main__":
    asyncio.run(main())
