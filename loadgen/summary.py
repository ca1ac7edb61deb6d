"""Latency percentiles, measurement-window stability and the server-side time split.

Pure functions over samples; the load generator, the simulator and the benchmarks share them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

PERCENTILES = (50, 90, 95, 99)
TIMING_PARTS = ("queue", "compute_input", "compute_infer", "compute_output")
"""The parts of ``InferResult.timing_us`` a worker fills, in the order they happen."""


@dataclass(frozen=True, slots=True)
class LatencySummary:
    """Latency of a set of requests, milliseconds."""

    count: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


EMPTY_LATENCY = LatencySummary(0, *([float("nan")] * 6))


def summarize(latencies_s: Sequence[float] | np.ndarray[Any, Any]) -> LatencySummary:
    """Percentiles (linear interpolation, as numpy's default) of latencies in seconds."""
    values = np.asarray(latencies_s, dtype=np.float64) * 1e3
    if values.size == 0:
        return EMPTY_LATENCY
    p50, p90, p95, p99 = (float(v) for v in np.percentile(values, PERCENTILES))
    return LatencySummary(
        int(values.size), float(values.mean()), p50, p90, p95, p99, float(values.max())
    )


@dataclass(frozen=True, slots=True)
class ServerSplit:
    """Where a request's time went inside the server: mean microseconds per request."""

    count: int
    queue_us: float
    compute_input_us: float
    compute_infer_us: float
    compute_output_us: float

    @property
    def server_us(self) -> float:
        return (
            self.queue_us + self.compute_input_us + self.compute_infer_us + self.compute_output_us
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "server_us": self.server_us}


def server_split(timings: Iterable[Mapping[str, int]]) -> ServerSplit | None:
    """Mean of the workers' per-request ``timing_us`` maps; None when there are none."""
    rows = [[t.get(part, 0) for part in TIMING_PARTS] for t in timings if t]
    if not rows:
        return None
    means = np.asarray(rows, dtype=np.float64).mean(axis=0)
    return ServerSplit(len(rows), *(float(m) for m in means))


def relative_spread(values: Sequence[float]) -> float:
    """(max - min) / min: 0 for identical values, inf when a value is 0 or missing."""
    if not values or min(values) <= 0 or any(np.isnan(values)):
        return float("inf")
    return (max(values) - min(values)) / min(values)


def is_stable(
    throughputs: Sequence[float], latencies: Sequence[float], *, tolerance: float, count: int
) -> bool:
    """perf_analyzer's rule: the last ``count`` windows' throughput and latency each lie
    within ``tolerance`` (max vs min) of one another."""
    if len(throughputs) < count or len(latencies) < count:
        return False
    return (
        relative_spread(throughputs[-count:]) <= tolerance
        and relative_spread(latencies[-count:]) <= tolerance
    )


def estimate_batch_sizes(
    samples: Iterable[tuple[float, str, Mapping[str, int]]], gap_s: float = 0.005
) -> list[int]:
    """Batch sizes a worker ran, recovered from results alone (an estimate).

    Every request of one batch carries the same ``compute_input`` and ``compute_infer``
    (they are measured once per batch) and comes back at nearly the same time. ``samples``
    are (client completion time, worker id, timing_us); requests are grouped by (worker,
    compute_input, compute_infer) and a group is split where completions are more than
    ``gap_s`` apart. Two batches of one worker finishing within ``gap_s`` with identical
    microsecond timings would be merged; for models that compute for more than a few
    microseconds that is rare.
    """
    groups: dict[tuple[str, int, int], list[float]] = {}
    for done, worker, timing in samples:
        if not timing:
            continue
        key = (worker, timing.get("compute_input", -1), timing.get("compute_infer", -1))
        groups.setdefault(key, []).append(done)
    sizes: list[int] = []
    for times in groups.values():
        times.sort()
        run = 1
        for prev, cur in itertools.pairwise(times):
            if cur - prev > gap_s:
                sizes.append(run)
                run = 0
            run += 1
        sizes.append(run)
    return sizes


def mean_batch_size(sizes: Sequence[int]) -> float:
    """Rows per batch, averaged over batches (NaN when there are none)."""
    return sum(sizes) / len(sizes) if sizes else float("nan")


def size_histogram(sizes: Iterable[int]) -> dict[int, int]:
    """Batch size -> number of batches, sorted by size."""
    hist: dict[int, int] = {}
    for s in sizes:
        hist[s] = hist.get(s, 0) + 1
    return dict(sorted(hist.items()))
