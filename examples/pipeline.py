"""A batch pipeline: push N jobs straight to Kafka, consume the result stream with a group.

Run against `make up` (Kafka on 127.0.0.1:9092, Redis on 127.0.0.1:6379):

    .venv/bin/python examples/pipeline.py --jobs 10000 --consumers 2

Exit status 0 when every job's result came back right, 1 when any is wrong or missing.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid

import numpy as np

from plaza.cli.argtypes import count
from plaza.client import PlazaClient, make_request
from plaza.settings import PlazaSettings


async def consume(
    client: PlazaClient,
    stream: str,
    name: str,
    want: int,
    seen: dict[str, float],
    complete: asyncio.Event,
) -> None:
    async for entry_id, results in client.consume(
        stream, "pipeline", name, block_ms=1000, idle_exit=True
    ):
        for result in results:
            seen[result.id] = float(result.output("OUTPUT0").to_numpy()[0, 0])
        await client.ack(stream, "pipeline", entry_id)
        if len(seen) >= want:
            complete.set()
        if complete.is_set():
            return


async def main(jobs: int, consumers: int) -> int:
    """Run the pipeline once and print what came back; the number of jobs whose result is
    wrong or missing."""
    async with PlazaClient(PlazaSettings()) as client:
        stream = client.results_stream(f"example-{uuid.uuid4().hex[:8]}")
        start = time.monotonic()
        ids = await client.publish_many(
            make_request(
                "identity", {"INPUT0": np.full((1, 8), i, np.float32)}, reply_stream=stream
            )
            for i in range(jobs)
        )
        published = time.monotonic() - start
        seen: dict[str, float] = {}
        complete = asyncio.Event()
        consumers_done = asyncio.gather(
            *(consume(client, stream, f"c{i}", jobs, seen, complete) for i in range(consumers))
        )
        # The pipeline is done when the last result is in (or when every consumer stopped
        # short of it). Then the other consumers are still blocked in their read (up to
        # block_ms) with nothing left to come: their wind-down is not the pipeline's time.
        consumers_done.add_done_callback(lambda _: complete.set())
        await complete.wait()
        elapsed = time.monotonic() - start
        await consumers_done
        wrong = sum(1 for i, rid in enumerate(ids) if seen.get(rid) != float(i))
        print(
            f"published {jobs} jobs in {published:.2f}s; {len(seen)} results in "
            f"{elapsed:.2f}s ({len(seen) / elapsed:.0f} jobs/s); wrong or missing: {wrong}"
        )
        return wrong


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=count, default=10_000, help="requests to publish")
    parser.add_argument("--consumers", type=count, default=2, help="result stream consumers")
    return parser.parse_args(argv)


def run(argv: list[str]) -> int:
    """The exit status: 0 when every result is right, 1 otherwise (2: bad arguments)."""
    args = parse_args(argv)
    wrong = asyncio.run(main(args.jobs, args.consumers))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
