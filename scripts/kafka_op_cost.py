"""The broker's CPU per Kafka operation that one Plaza request makes at concurrency 1.

At c=1 every request is its own produce (the gateway), fetch (the worker's long poll) and
offset commit (the worker, after the answer is written), and the broker's CPU per request
there is milliseconds (docs/benchmarks.md). This times each operation alone, one at a time,
N times, against a Kafka that already runs, with Plaza's own client settings
(plaza.connections), and divides the broker's CPU (from /proc) by N:

    python scripts/kafka_op_cost.py --bootstrap-servers 127.0.0.1:29092 --broker-pid PID \
        [--partitions 4] [--subscribe]

``--partitions`` and ``--subscribe`` make the consumer more like the worker's: every
partition of the topic fetched (records land on partition 0), and a group member rather
than an assignment.

Loopback only; bounded by N. Prints microseconds of broker CPU per operation.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable

from aiokafka import TopicPartition
from aiokafka.structs import OffsetAndMetadata

from plaza.connections import ensure_topics, kafka_consumer, kafka_producer
from plaza.settings import KafkaSettings


def broker_cpu_s(pid: int) -> float:
    """User + system seconds of ``pid`` and its threads."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bootstrap-servers", default="127.0.0.1:29092")
    p.add_argument("--broker-pid", type=int, required=True)
    p.add_argument("-n", type=int, default=2000)
    p.add_argument("--partitions", type=int, default=1, help="of the topic; all are fetched")
    p.add_argument("--subscribe", action="store_true", help="join the group (as the worker)")
    args = p.parse_args()
    k = KafkaSettings(
        bootstrap_servers=args.bootstrap_servers, linger_ms=0, partitions=args.partitions
    )
    topic = f"opcost-{uuid.uuid4().hex[:8]}"
    await ensure_topics(k, [topic])
    producer = kafka_producer(k)
    consumer = kafka_consumer(k, f"opcost-{topic}")
    await producer.start()
    await consumer.start()
    tp = TopicPartition(topic, 0)
    if args.subscribe:
        consumer.subscribe([topic])
        while not consumer.assignment():  # the group's first rebalance
            await consumer.getmany(timeout_ms=100)
    else:
        consumer.assign([TopicPartition(topic, i) for i in range(args.partitions)])
    n: int = args.n
    pid: int = args.broker_pid
    value = os.urandom(2100)  # about one mlp request envelope

    async def timed(name: str, op: Callable[[], Awaitable[None]]) -> float:
        await asyncio.sleep(1.0)  # the broker settles between kinds
        idle0 = broker_cpu_s(pid)
        await asyncio.sleep(2.0)
        idle_per_s = (broker_cpu_s(pid) - idle0) / 2.0
        cpu0, wall0 = broker_cpu_s(pid), time.monotonic()
        for _ in range(n):
            await op()
        cpu, wall = broker_cpu_s(pid) - cpu0, time.monotonic() - wall0
        net = cpu - idle_per_s * wall
        print(
            f"{name:<34} {net / n * 1e6:8.0f} us broker CPU per op "
            f"({n} in {wall:.1f} s; broker idle {idle_per_s * 1e3:.0f} ms/s subtracted)",
            flush=True,
        )
        return net / n

    async def produce() -> None:
        await (await producer.send(topic, value, partition=0))

    async def produce_and_fetch() -> None:
        await (await producer.send(topic, value, partition=0))
        await consumer.getone(tp)

    offset = 0

    async def commit() -> None:
        nonlocal offset
        offset += 1
        await consumer.commit({tp: OffsetAndMetadata(offset, "")})

    try:
        produce_s = await timed("produce (acks=all, idempotent)", produce)
        await consumer.seek_to_end()
        both_s = await timed("produce, then a fetch returns it", produce_and_fetch)
        print(f"{'  so the fetch':<34} {(both_s - produce_s) * 1e6:8.0f} us", flush=True)
        await timed("offset commit (one partition)", commit)
    finally:
        await consumer.stop()
        await producer.stop()


if __name__ == "__main__":
    asyncio.run(main())
