#!/usr/bin/env python
"""What Triton's latency summaries cost a worker (``worker.summary_latencies``).

    python scripts/summary_cost.py [--requests 200000] [--rounds 3]

Per round: the CPU of one ``LatencySummaries.observe`` (a request's five phases, the
default quantiles), over requests with drawn timings, and the CPU of one scrape's
``read`` of the five summaries once a window is full. Then how near the quantiles of a
full sample come to the true ones: a sorted stream of 100,000 values through a sample of
500, over 60 seeds (mean and spread of the 0.1, 0.5 and 0.9 quantiles, against the true
ones and the spread ``sqrt(q (1 - q) / n)`` predicts).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from plaza.settings import WorkerSettings, parse_quantiles
from plaza.workers.latency_summaries import LatencySummaries, WindowQuantiles


def observe_cost(requests: int, seed: int) -> tuple[float, float]:
    """(µs per observe, ms per scrape of the five summaries)."""
    quantiles = parse_quantiles(WorkerSettings().summary_quantiles)
    summaries = LatencySummaries(quantiles, seed=seed)
    draw = random.Random(seed)
    timings = [
        (draw.randrange(100, 5000), draw.randrange(5, 50), draw.randrange(10, 500), 20)
        for _ in range(requests)
    ]
    started = time.process_time()
    for queue, c_in, c_infer, c_out in timings:
        summaries.observe("1", queue, c_in, c_infer, c_out)
    per_request_us = (time.process_time() - started) / requests * 1e6
    started = time.process_time()
    for phase in summaries.phases:
        summaries.read(phase)
    return per_request_us, (time.process_time() - started) * 1e3


def accuracy(seeds: int = 60, size: int = 500, stream: int = 100_000) -> None:
    found = []
    for seed in range(seeds):
        window = WindowQuantiles(size, rng=random.Random(seed), clock=lambda: 0.0)
        for value in range(stream):
            window.observe(value)
        found.append(window.quantiles([0.1, 0.5, 0.9]))
    for i, q in enumerate((0.1, 0.5, 0.9)):
        values = [f[i] for f in found]
        print(
            f"q={q}: mean {statistics.mean(values):,.0f} (true {q * stream:,.0f}), "
            f"spread {statistics.stdev(values):,.0f} "
            f"(predicted {stream * (q * (1 - q) / size) ** 0.5:,.0f})"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for round_ in range(args.rounds):
        per_request, scrape = observe_cost(args.requests, round_)
        print(f"round {round_ + 1}: {per_request:.2f} µs per request, scrape {scrape:.1f} ms")
    accuracy()


if __name__ == "__main__":
    main()
