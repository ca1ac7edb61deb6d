"""A burst of first requests to a new topic: how long until all are acknowledged, and the
CPU the publishing process spent on it.

    python scripts/first_publish_burst.py --bootstrap-servers 127.0.0.1:29092 -c 64 --rounds 3

Each round starts a fresh ``RequestPublisher`` (as a gateway or an SDK client starting
up) and publishes C identity requests at once to a topic that does not exist yet (a fresh
prefix), so every one of them finds the topic unknown. Prints, per round, the wall time to
the last acknowledgement and the process's CPU time meanwhile, with the number of topics in
the cluster (each topic creation reads the metadata of all of them). Loopback only;
bounded by C times ROUNDS requests.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import numpy as np

from plaza.client import make_request
from plaza.connections import kafka_admin
from plaza.naming import Names
from plaza.publisher import RequestPublisher
from plaza.settings import KafkaSettings


async def cluster_topics(kafka: KafkaSettings) -> int:
    admin = kafka_admin(kafka)
    await admin.start()
    try:
        return len(await admin.list_topics())
    finally:
        await admin.close()


async def burst(bootstrap: str, concurrency: int) -> tuple[float, float]:
    prefix = f"burst{uuid.uuid4().hex[:8]}."
    kafka = KafkaSettings(bootstrap_servers=bootstrap, topic_prefix=prefix)
    names = Names(topic_prefix=prefix, key_prefix=prefix)
    topic = names.request_topic("identity")
    x = {"INPUT0": np.zeros((1, 16), np.float32)}
    requests = [make_request("identity", x) for _ in range(concurrency)]
    publisher = RequestPublisher(kafka, names)
    await publisher.start()
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(publisher.publish(r, topic) for r in requests))
        return time.perf_counter() - wall, time.process_time() - cpu
    finally:
        await publisher.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap-servers", default="127.0.0.1:29092")
    parser.add_argument("-c", "--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    kafka = KafkaSettings(bootstrap_servers=args.bootstrap_servers)
    print(f"topics in the cluster: {await cluster_topics(kafka)}")
    for r in range(1, args.rounds + 1):
        wall_s, cpu_s = await burst(args.bootstrap_servers, args.concurrency)
        print(
            f"round {r}: {args.concurrency} first requests acknowledged in "
            f"{wall_s * 1e3:.0f} ms, {cpu_s * 1e3:.0f} ms of CPU"
        )


if __name__ == "__main__":
    asyncio.run(main())
