"""Triton's latency summaries: ``nv_inference_request_summary_us`` and its four phases,
served when ``worker.summary_latencies`` is on (Triton's ``--metrics-config
summary_latencies=true``), off by default as in Triton.

Each is a Prometheus summary per model and version: ``_count`` and ``_sum`` (microseconds)
since the worker started, and one sample per quantile of ``worker.summary_quantiles``
(Triton's ``summary_quantiles``: ``<quantile>:<error>`` pairs, comma-separated, default
``0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001``; ``plaza.settings.parse_quantiles``) over the
requests answered in the last ``MAX_AGE_S`` seconds, in ``AGE_BUCKETS`` steps (the window
of Triton's summaries, prometheus-cpp's defaults). A window without requests gives NaN, as
Triton's does.

Quantiles come from a bounded sample of each step's values (reservoir sampling, Li's
Algorithm L: every value of the step has the same chance to be kept), each value weighing
the step's count over its sample's size. A sample of ``n`` values puts a quantile ``q``
within a rank error of about ``sqrt(q * (1 - q) / n)``, so each step keeps enough values
for the tightest of the configured errors (9,900 for the defaults), at most ``MAX_SAMPLES``.

Observed for each request answered with success (a failure has no phases): the request
(queue + compute input + infer + output, the worker's view of it), and each phase. As in
Triton, a model with ``response_cache`` has no request summary (its cached answers would
count nothing).
"""

from __future__ import annotations

import math
import random
import threading
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterable

import numpy as np

from plaza.settings import Quantiles

MAX_AGE_S = 60.0
AGE_BUCKETS = 5
MAX_SAMPLES = 20_000
"""Values kept per step of the window, at most, whatever the errors ask."""

SUMMARY_FAMILIES = {
    "request": (
        "nv_inference_request_summary_us",
        "Summary of inference request duration in microseconds",
    ),
    "queue": (
        "nv_inference_queue_summary_us",
        "Summary of inference queuing duration in microseconds",
    ),
    "compute_input": (
        "nv_inference_compute_input_summary_us",
        "Summary of compute input duration in microseconds",
    ),
    "compute_infer": (
        "nv_inference_compute_infer_summary_us",
        "Summary of compute inference duration in microseconds",
    ),
    "compute_output": (
        "nv_inference_compute_output_summary_us",
        "Summary of inference compute output duration in microseconds",
    ),
}
"""Each phase's Prometheus family (Triton's names) and its help text."""
PHASES = tuple(SUMMARY_FAMILIES)
"""What a request's answer is observed for, in the order ``observe`` takes them."""


def sample_size(quantiles: Quantiles) -> int:
    """Values to keep per step for every quantile's error (see the module doc)."""
    # (less a hair: 0.99 * 0.01 / 0.001**2 is 9900.000000000002 in floating point)
    needed = max((math.ceil(q * (1 - q) / (e * e) - 1e-9) for q, e in quantiles), default=1)
    return max(1, min(MAX_SAMPLES, needed))


class _Step:
    """One step of the window: how many values it saw, and a uniform sample of them.

    Once the sample is full, the next value to keep is drawn ahead (Li's "Algorithm L"):
    the values in between cost a count and a comparison, not a random number each."""

    __slots__ = ("count", "kept", "next_kept", "start", "weight")

    def __init__(self, start: float) -> None:
        self.start = start
        self.count = 0
        self.kept = array("d")
        self.next_kept = 0
        """The count at which the next value is kept (once the sample is full)."""
        self.weight = 1.0
        """Algorithm L's running ``W``."""

    def skip_ahead(self, rng: random.Random, capacity: int) -> None:
        """Draw the count of the next value to keep."""
        self.weight *= math.exp(math.log(1.0 - rng.random()) / capacity)
        gap = math.log(1.0 - rng.random()) / math.log1p(-self.weight) if self.weight < 1 else 0
        self.next_kept = self.count + int(gap) + 1


class WindowQuantiles:
    """The quantiles of the values observed over the last ``max_age_s`` (in ``steps``
    steps), and the count and sum of every value since it was made. Not thread-safe:
    ``LatencySummaries`` holds the lock."""

    def __init__(
        self,
        capacity: int,
        *,
        max_age_s: float = MAX_AGE_S,
        steps: int = AGE_BUCKETS,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self._capacity = capacity
        self._max_age_s = max_age_s
        self._step_s = max_age_s / steps
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._steps: deque[_Step] = deque()
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float, now: float | None = None) -> None:
        """Count ``value`` (``now``: the clock's reading, when the caller has one)."""
        self.count += 1
        self.sum += value
        step = self._current(self._clock() if now is None else now)
        step.count += 1
        if step.count < step.next_kept:
            return  # a full sample that does not keep this one
        if len(step.kept) < self._capacity:
            step.kept.append(value)
            if len(step.kept) == self._capacity:
                step.skip_ahead(self._rng, self._capacity)
            return
        step.kept[self._rng.randrange(self._capacity)] = value
        step.skip_ahead(self._rng, self._capacity)

    def quantiles(self, wanted: Iterable[float]) -> list[float]:
        """Each of ``wanted`` over the window (NaN for every one when it saw nothing)."""
        self._expire()
        steps = [s for s in self._steps if s.count]
        if not steps:
            return [math.nan for _ in wanted]
        values = np.concatenate([np.frombuffer(s.kept, dtype=np.float64) for s in steps])
        weights = np.concatenate([np.full(len(s.kept), s.count / len(s.kept)) for s in steps])
        order = np.argsort(values, kind="stable")
        values, cumulative = values[order], np.cumsum(weights[order])
        total = cumulative[-1]
        out = []
        for q in wanted:
            at = int(np.searchsorted(cumulative, q * total, side="left"))
            out.append(float(values[min(at, len(values) - 1)]))
        return out

    def _current(self, now: float) -> _Step:
        if not self._steps or now - self._steps[-1].start >= self._step_s:
            self._steps.append(_Step(now))
            self._expire(now)
        return self._steps[-1]

    def _expire(self, now: float | None = None) -> None:
        if now is None:
            now = self._clock()
        while self._steps and now - self._steps[0].start >= self._max_age_s:
            self._steps.popleft()


class LatencySummaries:
    """One model's latency summaries, per version (thread-safe: the loop observes, the
    metrics server's thread reads)."""

    def __init__(
        self,
        quantiles: Quantiles,
        *,
        request: bool = True,
        clock: Callable[[], float] = time.monotonic,
        seed: int | None = None,
    ) -> None:
        """``request``: whether to keep the request summary (not with a response cache)."""
        self.quantiles = quantiles
        self.phases = PHASES if request else PHASES[1:]
        self._capacity = sample_size(quantiles)
        self._clock = clock
        self._rng = random.Random(seed)
        self._windows: dict[str, dict[str, WindowQuantiles]] = {}
        self._lock = threading.Lock()

    def observe(self, version: str, queue: int, c_in: int, c_infer: int, c_out: int) -> None:
        """One request answered with success: its phases, microseconds."""
        now = self._clock()
        with self._lock:
            windows = self._windows.get(version) or self._add(version)
            if "request" in windows:
                windows["request"].observe(queue + c_in + c_infer + c_out, now)
            windows["queue"].observe(queue, now)
            windows["compute_input"].observe(c_in, now)
            windows["compute_infer"].observe(c_infer, now)
            windows["compute_output"].observe(c_out, now)

    def read(self, phase: str) -> list[tuple[str, list[float], int, float]]:
        """``phase``'s summary of each version: (version, the quantiles' values in the order
        of ``quantiles``, count, sum)."""
        wanted = [q for q, _ in self.quantiles]
        with self._lock:
            return [
                (version, w.quantiles(wanted), w.count, w.sum)
                for version, windows in sorted(self._windows.items())
                if (w := windows.get(phase)) is not None
            ]

    def _add(self, version: str) -> dict[str, WindowQuantiles]:
        windows = {
            phase: WindowQuantiles(self._capacity, clock=self._clock, rng=self._rng)
            for phase in self.phases
        }
        self._windows[version] = windows
        return windows
