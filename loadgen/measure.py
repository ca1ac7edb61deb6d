"""Measuring one load point, as perf_analyzer does: windows repeated until stable.

A load is a fixed concurrency (closed loop: N clients, each sending again as soon as its
answer is back) or a request rate (open loop: sends on a constant or Poisson schedule, at
most ``max_in_flight`` outstanding). After a warm-up, back-to-back windows of ``window_s``
are measured until ``stable_count`` consecutive ones agree within ``tolerance`` on both
throughput and mean latency, or ``max_windows`` have run. The point's figures come from
those last windows together.

In rate mode a send is timed from when it actually goes out (as perf_analyzer times it),
so a send held back behind ``max_in_flight`` does not count its wait in the latency. Such
a point is shown instead by its ``late_sends`` and its achieved ``send_rate`` against the
offered rate, both over the measured windows.

Every loop is bounded: the load stops when measuring stops, requests carry the target's
timeout, and what is still in flight after ``drain_s`` is cancelled. A closed-loop client
yields to the event loop after every failure, so a target that fails without waiting (a
refused URL) cannot starve the window timer or Ctrl-C. Only successes are kept one by one
(each waited for its answer); failures are a count and a few distinct messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from plaza.loadgen.arrivals import ArrivalProcess, Distribution
from plaza.loadgen.summary import (
    LatencySummary,
    ServerSplit,
    estimate_batch_sizes,
    is_stable,
    server_split,
    size_histogram,
    summarize,
)
from plaza.loadgen.targets import Outcome, StatsSnapshot, Target, batches_between, split_between

Mode = Literal["concurrency", "rate"]
MAX_ERROR_EXAMPLES = 5


@dataclass(frozen=True, slots=True)
class Load:
    """``concurrency`` clients, or ``rate`` requests/s with a distribution."""

    mode: Mode
    value: float
    distribution: Distribution = "constant"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode == "concurrency" and not (self.value >= 1 and float(self.value).is_integer()):
            raise ValueError(f"concurrency must be a whole number >= 1, got {self.value:g}")
        if self.mode == "rate" and not 0 < self.value < math.inf:
            raise ValueError(f"request rate must be a number > 0, got {self.value:g}")

    @property
    def label(self) -> str:
        if self.mode == "concurrency":
            return f"concurrency {int(self.value)}"
        return f"rate {self.value:g}/s {self.distribution}"


@dataclass(frozen=True, slots=True)
class WindowConfig:
    window_s: float = 2.0
    warmup_s: float = 1.0
    tolerance: float = 0.10
    stable_count: int = 3
    max_windows: int = 10
    max_in_flight: int = 4096
    drain_s: float = 10.0

    def __post_init__(self) -> None:
        """Every bad value is refused here, before anything runs (flags in parentheses)."""
        checks = [
            (0 < self.window_s < math.inf, "window_s (--window-s) must be > 0"),
            (0 <= self.warmup_s < math.inf, "warmup_s (--warmup-s) must be >= 0"),
            (0 <= self.tolerance < math.inf, "tolerance (--stability) must be >= 0"),
            (self.stable_count >= 1, "stable_count (--stable-windows) must be >= 1"),
            (self.max_windows >= 1, "max_windows (--max-windows) must be >= 1"),
            (self.max_in_flight >= 1, "max_in_flight (--max-in-flight) must be >= 1"),
            (0 <= self.drain_s < math.inf, "drain_s must be >= 0"),
        ]
        failed = [message for ok, message in checks if not ok]
        if failed:
            raise ValueError("; ".join(failed))


@dataclass(frozen=True, slots=True)
class Sample:
    done: float
    latency_s: float
    outcome: Outcome


@dataclass(frozen=True, slots=True)
class WindowResult:
    duration_s: float
    completed: int
    errors: int
    throughput: float
    latency: LatencySummary


@dataclass(slots=True)
class PointResult:
    """One load point on one target."""

    target: str
    load: Load
    windows: list[WindowResult]
    stable: bool
    throughput: float
    completed: int
    errors: int
    latency: LatencySummary
    server: ServerSplit | None
    batch_sizes: dict[int, int] = field(default_factory=dict)
    """Batches run, by size: from the server's statistics, else estimated from the results'
    timings (stats.estimate_batch_sizes); empty when neither is available."""
    batch_source: str = ""
    """"stats", "estimate" or ""."""
    model_busy: float = float("nan")
    """Fraction of the time the backend was executing (server statistics; NaN without)."""
    total_ok: int = 0
    """Answers over the whole run, warm-up and drain included (for per-request CPU cost)."""
    late_sends: int = 0
    """Rate mode: sends more than 1 ms behind schedule (client or in-flight bound), over
    the measured windows. Their latency counts from the actual send, not the schedule."""
    send_rate: float = float("nan")
    """Sends per second over the measured windows: in rate mode, what the schedule
    (``offered_rate``) could actually be kept to."""
    error_examples: list[str] = field(default_factory=list)
    """The run's first few distinct error messages (warm-up included), sorted."""

    @property
    def mean_batch(self) -> float:
        """Rows per batch over the batches run (NaN when unknown)."""
        runs = sum(self.batch_sizes.values())
        rows = sum(s * n for s, n in self.batch_sizes.items())
        return rows / runs if runs else float("nan")

    @property
    def offered_rate(self) -> float | None:
        """Rate mode: the requests/s the schedule asked for (None in concurrency mode)."""
        return self.load.value if self.load.mode == "rate" else None

    @property
    def client_overhead_us(self) -> float:
        """Mean latency minus mean server time: transport, Kafka, Redis, client."""
        if self.server is None:
            return float("nan")
        return self.latency.mean_ms * 1e3 - self.server.server_us

    def as_row(self) -> dict[str, Any]:
        """A flat row for CSV."""
        server = self.server.as_dict() if self.server else {}
        return {
            "target": self.target,
            "mode": self.load.mode,
            "value": self.load.value,
            "distribution": self.load.distribution if self.load.mode == "rate" else "",
            "throughput": round(self.throughput, 2),
            **{f"{k}": round(v, 3) for k, v in self.latency.as_dict().items() if k != "count"},
            "completed": self.completed,
            "errors": self.errors,
            "stable": self.stable,
            "windows": len(self.windows),
            "queue_us": round(server.get("queue_us", float("nan")), 1),
            "compute_input_us": round(server.get("compute_input_us", float("nan")), 1),
            "compute_infer_us": round(server.get("compute_infer_us", float("nan")), 1),
            "compute_output_us": round(server.get("compute_output_us", float("nan")), 1),
            "client_overhead_us": round(self.client_overhead_us, 1),
            "mean_batch": round(self.mean_batch, 2),
            "batch_source": self.batch_source,
            "model_busy": round(self.model_busy, 3),
            "offered_rate": self.offered_rate,
            "send_rate": round(self.send_rate, 2),
            "late_sends": self.late_sends,
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.as_row(),
            "latency": self.latency.as_dict(),
            "server": self.server.as_dict() if self.server else None,
            "batch_sizes": {str(k): v for k, v in self.batch_sizes.items()},
            "window_throughputs": [round(w.throughput, 2) for w in self.windows],
            "window_mean_ms": [round(w.latency.mean_ms, 3) for w in self.windows],
            "error_examples": self.error_examples,
        }


class _Recorder:
    """A run's requests: each success as a sample (its latency is measured), failures as a
    count and the first ``MAX_ERROR_EXAMPLES`` distinct messages, so a target failing as
    fast as the loop turns does not grow the run's memory."""

    def __init__(self) -> None:
        self.samples: list[Sample] = []
        """Successful requests, in completion order."""
        self.errors = 0
        self.error_examples: list[str] = []
        self.sends = 0
        self.late = 0

    def add(self, sent: float, outcome: Outcome) -> None:
        done = time.monotonic()
        if outcome.ok:
            self.samples.append(Sample(done, done - sent, outcome))
            return
        self.errors += 1
        examples = self.error_examples
        if len(examples) < MAX_ERROR_EXAMPLES and outcome.error not in examples:
            examples.append(outcome.error)


async def _closed_loop(target: Target, clients: int, rec: _Recorder, stop: asyncio.Event) -> None:
    async def client() -> None:
        while not stop.is_set():
            sent = time.monotonic()
            rec.sends += 1
            outcome = await target.send()
            rec.add(sent, outcome)
            if not outcome.ok:
                # a failure may have come back without awaiting anything: let the loop run
                # (the window timer, the stop event, Ctrl-C) before sending again
                await asyncio.sleep(0)

    await asyncio.gather(*(client() for _ in range(clients)))


async def _open_loop(
    target: Target, load: Load, cfg: WindowConfig, rec: _Recorder, stop: asyncio.Event
) -> None:
    horizon = cfg.warmup_s + cfg.max_windows * cfg.window_s + 60.0
    arrivals = ArrivalProcess(load.value, load.distribution, seed=load.seed)
    room = asyncio.Semaphore(cfg.max_in_flight)
    tasks: set[asyncio.Task[None]] = set()

    async def one() -> None:
        try:
            sent = time.monotonic()
            rec.add(sent, await target.send())
        finally:
            room.release()

    start = time.monotonic()
    for offset in arrivals.times(horizon):
        await asyncio.sleep(max(0.0, start + offset - time.monotonic()))
        if stop.is_set():
            break
        await room.acquire()
        rec.sends += 1
        if time.monotonic() - (start + offset) > 1e-3:
            rec.late += 1
        task = asyncio.create_task(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks, return_exceptions=True)


async def _finish(task: asyncio.Task[None], drain_s: float) -> None:
    try:
        await asyncio.wait_for(asyncio.shield(task), drain_s)
    except TimeoutError:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task


@dataclass(frozen=True, slots=True)
class _Mark:
    """The recorder's counts at a window boundary."""

    index: int
    at: float
    stats: StatsSnapshot | None
    sends: int
    late: int
    errors: int


async def _mark(target: Target, rec: _Recorder) -> _Mark:
    index, sends, late, errors = len(rec.samples), rec.sends, rec.late, rec.errors
    at = time.monotonic()
    return _Mark(index, at, await target.stats(), sends, late, errors)


def _window(rec: _Recorder, m0: _Mark, m1: _Mark) -> WindowResult:
    ok = [s.latency_s for s in rec.samples[m0.index : m1.index]]
    duration = m1.at - m0.at
    return WindowResult(duration, len(ok), m1.errors - m0.errors, len(ok) / duration, summarize(ok))


async def measure(
    target: Target,
    load: Load,
    cfg: WindowConfig,
    on_window: Callable[[WindowResult], None] | None = None,
) -> PointResult:
    """Drive ``load`` at ``target`` and measure it (module docstring)."""
    rec, stop = _Recorder(), asyncio.Event()
    if load.mode == "concurrency":
        driver = asyncio.create_task(_closed_loop(target, int(load.value), rec, stop))
    else:
        driver = asyncio.create_task(_open_loop(target, load, cfg, rec, stop))
    windows: list[WindowResult] = []
    marks: list[_Mark] = []
    try:
        await asyncio.sleep(cfg.warmup_s)
        marks.append(await _mark(target, rec))
        for _ in range(cfg.max_windows):
            await asyncio.sleep(cfg.window_s)
            marks.append(await _mark(target, rec))
            m0, m1 = marks[-2], marks[-1]
            windows.append(_window(rec, m0, m1))
            if on_window is not None:
                on_window(windows[-1])
            if driver.done() or is_stable(
                [w.throughput for w in windows],
                [w.latency.mean_ms for w in windows],
                tolerance=cfg.tolerance,
                count=cfg.stable_count,
            ):
                break
    finally:
        stop.set()
        await _finish(driver, cfg.drain_s)
    if driver.done() and not driver.cancelled() and driver.exception() is not None:
        raise RuntimeError(f"load driver failed: {driver.exception()!r}")
    return _point(target.label, load, cfg, windows, rec, marks)


def _point(
    label: str,
    load: Load,
    cfg: WindowConfig,
    windows: list[WindowResult],
    rec: _Recorder,
    marks: list[_Mark],
) -> PointResult:
    k = min(cfg.stable_count, len(windows))
    m0, m1 = marks[-k - 1], marks[-1]
    (t0, s0), (t1, s1) = (m0.at, m0.stats), (m1.at, m1.stats)
    ok = rec.samples[m0.index : m1.index]
    timings = [s.outcome.timing_us for s in ok if s.outcome.timing_us]
    split = server_split(timings) if timings else split_between(s0, s1)
    batches, source = batches_between(s0, s1), "stats"
    if not batches:
        estimate = estimate_batch_sizes((s.done, s.outcome.worker, s.outcome.timing_us) for s in ok)
        batches, source = size_histogram(estimate), "estimate" if estimate else ""
    return PointResult(
        target=label,
        load=load,
        windows=windows,
        stable=is_stable(
            [w.throughput for w in windows],
            [w.latency.mean_ms for w in windows],
            tolerance=cfg.tolerance,
            count=cfg.stable_count,
        ),
        throughput=len(ok) / (t1 - t0),
        completed=len(ok),
        errors=m1.errors - m0.errors,
        latency=summarize([s.latency_s for s in ok]),
        server=split,
        batch_sizes=batches,
        batch_source=source,
        model_busy=(s1.busy_ns - s0.busy_ns) / 1e9 / (t1 - t0) if s0 and s1 else float("nan"),
        total_ok=len(rec.samples),
        late_sends=m1.late - m0.late,
        send_rate=(m1.sends - m0.sends) / (t1 - t0),
        error_examples=sorted(rec.error_examples),
    )
