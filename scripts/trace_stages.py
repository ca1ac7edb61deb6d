"""Where traced requests spent their time: the mean and median of each stage between two
of Triton's trace timestamps, read from a trace file the gateway wrote (one JSON line per
request, ``gateway/tracing.py``).

    TRACE_RATE=20 scripts/profile_perf_analyzer.sh mlp http 16
    python scripts/trace_stages.py var/profile/pa-mlp-http-c16-p0-uvicorn-shmnone/traces/trace.jsonl

The first fifth of the traces is left out (the run's warm-up). The stages:
``REQUEST_START`` (the gateway decoded the request) to ``QUEUE_START`` (the worker fetched
it: the publish, Kafka and the fetch), to ``COMPUTE_START`` (the delivery count's round
trip and the wait for a batch), the model's run in three parts, and ``COMPUTE_END`` to
``REQUEST_END`` (the result written to Redis and read back by the gateway). The worker's
stamps and the gateway's come from two clocks; on one host they are the same clock.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from pathlib import Path

STAMPS = (
    "REQUEST_START",
    "QUEUE_START",
    "COMPUTE_START",
    "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START",
    "COMPUTE_END",
    "REQUEST_END",
)


def stages(path: Path) -> dict[str, list[float]]:
    """Each stage's durations in milliseconds, over the traces after the first fifth."""
    lines = path.read_text().splitlines()
    found: dict[str, list[float]] = {}
    for line in lines[len(lines) // 5 :]:
        at = {s["name"]: s["ns"] for s in json.loads(line)["timestamps"]}
        for start, end in [*itertools.pairwise(STAMPS), (STAMPS[0], STAMPS[-1])]:
            if start in at and end in at:
                found.setdefault(f"{start} -> {end}", []).append((at[end] - at[start]) / 1e6)
    return found


def main() -> None:
    for stage, ms in stages(Path(sys.argv[1])).items():
        mean, median = statistics.mean(ms), statistics.median(ms)
        print(f"{stage:45s} mean {mean:6.2f} ms  p50 {median:6.2f} ms  ({len(ms)} traces)")


if __name__ == "__main__":
    main()
