"""A headless scheduling simulator: Plaza's own batcher on a simulated clock.

Discrete-event: the events are arrivals, batch completions and the batcher's ``wake_at``.
``plaza.batching.DynamicBatcher`` decides every batch, exactly as in a worker, but its clock
is the simulation's. A latency model (``plaza.loadgen.latency``) says how long a batch takes.

Plaza's layout is modelled: each *instance* is one worker process with its own batcher,
owning some of the topic's ``partitions`` (partition ``p`` goes to instance ``p % n``), and
each request lands on a partition at random (its key is a random correlation id). A worker
holds at most ``max_pending`` requests; the rest wait in Kafka and count as consumer lag
(the batcher's ``backlog``). ``routing="shared"`` instead feeds every instance from one
batcher, as Triton schedules instances of one model (and a worker its ``instance_group``
count). A priority level with a ``max_queue_size`` is bounded as in a worker: the batcher
never refuses a request (``bounded=False``), the worker just fetches no more of a full
level, so its requests stay in Kafka (lag) until the level has room. The simulated load
names no priority: every request runs at the policy's default level.

Load is open (an ``ArrivalProcess``: constant, Poisson, bursts) or closed (``concurrency``
clients, each sending again as soon as its answer is back, ``overhead_s`` being the round
trip outside the worker: client, Kafka, Redis).

Arrivals are drawn one at a time (the next is scheduled when one is handled), so memory
grows with the requests run, never with the arrivals still to come. A run that reaches
``max_events`` stops there and says so (``SimResult.truncated``): its rates are not
reported (NaN), since the window was not simulated to its end.
"""

from __future__ import annotations

import heapq
import itertools
import math
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from plaza.batching import BatchingPolicy, DynamicBatcher
from plaza.loadgen.arrivals import ArrivalProcess
from plaza.loadgen.latency import LatencyModel
from plaza.loadgen.summary import LatencySummary, mean_batch_size, size_histogram, summarize

Routing = Literal["partitioned", "shared"]
_ARRIVE, _DONE, _WAKE, _ISSUE = 0, 1, 2, 3
MAX_EVENTS = 10_000_000
"""The default bound on a run's events (arrivals, completions, wake-ups)."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    """What to simulate. Give ``arrivals`` (open loop) or ``concurrency`` (closed loop)."""

    policy: BatchingPolicy
    latency: LatencyModel
    arrivals: ArrivalProcess | None = None
    concurrency: int | None = None
    overhead_s: float = 0.0
    """Round trip outside the worker; half before the batcher, half after."""
    instances: int = 1
    partitions: int = 4
    routing: Routing = "partitioned"
    max_pending: int = 1024
    rows_per_request: int = 1
    duration_s: float = 10.0
    """Requests are sent during [0, duration_s); then the queue drains."""
    warmup_s: float = 1.0
    """Statistics cover [warmup_s, duration_s)."""
    seed: int = 0
    max_events: int = MAX_EVENTS
    depth_points: int = 200

    def __post_init__(self) -> None:
        if (self.arrivals is None) == (self.concurrency is None):
            raise ValueError("give exactly one of arrivals (open loop) or concurrency")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        if self.instances < 1 or self.partitions < 1 or self.max_pending < 1:
            raise ValueError("instances, partitions and max_pending must be >= 1")
        if not 0 <= self.warmup_s < self.duration_s or not math.isfinite(self.duration_s):
            raise ValueError("need 0 <= warmup_s < duration_s (finite)")
        if not 0 <= self.overhead_s < math.inf:
            raise ValueError(f"overhead must be >= 0 and finite, got {self.overhead_s * 1e3:g} ms")
        if self.max_events < 1:
            raise ValueError(f"max_events must be >= 1, got {self.max_events}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        _check_policy(self.policy, self.rows_per_request)


@dataclass(frozen=True, slots=True)
class SimResult:
    """What the simulated run did, over the measurement window."""

    throughput: float
    """Answers per second (requests, not rows) reaching the clients in the window."""
    completed: int
    expired: int
    latency: LatencySummary
    """Client-side: send to answer, overhead included."""
    server_latency: LatencySummary
    """Arrival at the worker to batch completion."""
    batch_sizes: dict[int, int]
    mean_batch: float
    depth_mean: float
    depth_max: int
    depth_series: list[tuple[float, int]]
    """(time, requests waiting in workers and Kafka), sampled evenly over the run."""
    utilization: list[float]
    """Busy fraction of each instance over the window."""
    unfinished: int = 0
    """Requests still queued when the event limit stopped the run (normally 0)."""
    truncated: bool = False
    """The event limit stopped the run before its end: ``throughput`` and ``utilization``
    are NaN (the window was not simulated to its end), the latencies cover only the
    requests answered before the stop."""
    simulated_s: float = 0.0
    """The simulated clock when the run stopped."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "throughput": self.throughput,
            "completed": self.completed,
            "expired": self.expired,
            "latency": self.latency.as_dict(),
            "server_latency": self.server_latency.as_dict(),
            "batch_sizes": {str(k): v for k, v in self.batch_sizes.items()},
            "mean_batch": self.mean_batch,
            "depth_mean": self.depth_mean,
            "depth_max": self.depth_max,
            "depth_series": self.depth_series,
            "utilization": self.utilization,
            "unfinished": self.unfinished,
            "truncated": self.truncated,
            "simulated_s": self.simulated_s,
        }


class _Clock:
    __slots__ = ("now",)

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(slots=True)
class _Lane:
    """One batcher and the instances it feeds (one worker, or all of them when shared)."""

    batcher: DynamicBatcher[int]
    free: int
    lag: list[int] = field(default_factory=list)
    lag_head: int = 0
    in_flight: int = 0
    wake_token: int = 0
    busy_s: float = 0.0
    dirty: bool = False
    """Something changed at this instant: decide once every event of the instant is in."""

    @property
    def lag_len(self) -> int:
        return len(self.lag) - self.lag_head


class Simulator:
    """Runs one SimConfig; ``run()`` returns a SimResult (deterministic for a seed)."""

    def __init__(self, config: SimConfig) -> None:
        self.cfg = config
        self.clock = _Clock()
        shared = config.routing == "shared"
        lanes = 1 if shared else config.instances
        per_lane = config.instances if shared else 1
        # unbounded, as a worker's: a full level is not fetched (``_room``), never refused
        self.lanes = [
            _Lane(DynamicBatcher(config.policy, clock=self.clock, bounded=False), per_lane)
            for _ in range(lanes)
        ]
        self._level = config.policy.level_of(0)
        """The level every request runs at: the load names no priority (the default)."""
        self._owner = [p % lanes for p in range(config.partitions)]
        self._rng = np.random.default_rng(config.seed)
        self._events: list[tuple[float, int, int, int, Any]] = []
        self._seq = itertools.count()
        self._arrivals: Iterator[float] = iter(
            () if config.arrivals is None else config.arrivals.times(config.duration_s)
        )
        # per request, 8 bytes a figure: memory grows with the requests run
        self.issued = array("d")
        self.arrived = array("d")
        self.done = array("d")
        self._batches: list[tuple[float, int]] = []
        self._depth: list[tuple[float, int]] = [(0.0, 0)]
        self._waiting = 0
        self.expired = 0

    # -- event queue ---------------------------------------------------------------------
    def _push(self, at: float, kind: int, data: Any, *, first: bool = False) -> None:
        """``first``: before the other events of the same instant (open-loop arrivals, as
        if every one had been scheduled at the start)."""
        heapq.heappush(self._events, (at, 0 if first else 1, next(self._seq), kind, data))

    def run(self) -> SimResult:
        self._schedule_load()
        handlers: dict[int, Callable[[Any], None]] = {
            _ISSUE: self._on_issue,
            _ARRIVE: self._on_arrive,
            _DONE: self._on_done,
            _WAKE: self._on_wake,
        }
        for _ in range(self.cfg.max_events):
            if not self._events:
                break
            at, _, _, kind, data = heapq.heappop(self._events)
            self.clock.now = at
            handlers[kind](data)
            if not self._events or self._events[0][0] > at:
                self._decide_dirty()
        return self._result(truncated=bool(self._events))

    def _decide_dirty(self) -> None:
        """Like a worker, whose intake adds every record of a fetch before the scheduler
        decides: requests arriving at the same instant can share a batch."""
        for lane in self.lanes:
            if lane.dirty:
                lane.dirty = False
                self._dispatch(lane)

    def _schedule_load(self) -> None:
        cfg = self.cfg
        if cfg.arrivals is not None:
            self._next_arrival()
        else:
            assert cfg.concurrency is not None
            for _ in range(cfg.concurrency):
                self._push(0.0, _ISSUE, None)

    def _next_arrival(self) -> None:
        """Schedule the arrival process's next send, if any is left."""
        at = next(self._arrivals, None)
        if at is not None:
            self._push(at, _ISSUE, None, first=True)

    # -- handlers ------------------------------------------------------------------------
    def _on_issue(self, _: Any) -> None:
        if self.cfg.arrivals is not None:
            self._next_arrival()
        rid = len(self.issued)
        self.issued.append(self.clock.now)
        self.arrived.append(float("nan"))
        self.done.append(float("nan"))
        self._push(self.clock.now + self.cfg.overhead_s / 2, _ARRIVE, rid)

    def _on_arrive(self, rid: int) -> None:
        self.arrived[rid] = self.clock.now
        partition = int(self._rng.integers(self.cfg.partitions))
        lane = self.lanes[self._owner[partition]]
        self._waiting += 1
        self._note_depth()
        lane.lag.append(rid)  # in Kafka until the worker fetches it, in order
        self._refill(lane)
        lane.dirty = True

    def _on_done(self, data: tuple[_Lane, list[int], float]) -> None:
        lane, batch, started = data
        now = self.clock.now
        lane.free += 1
        lane.in_flight -= len(batch)
        lane.busy_s += _overlap(started, now, self.cfg.warmup_s, self.cfg.duration_s)
        for rid in batch:
            self.done[rid] = now
            self._answered(now)
        self._refill(lane)
        lane.dirty = True

    def _on_wake(self, data: tuple[_Lane, int]) -> None:
        lane, token = data
        if token == lane.wake_token:
            lane.dirty = True

    def _answered(self, now: float) -> None:
        """A request left the system; a closed-loop client sends its next one."""
        if self.cfg.concurrency is not None:
            again = now + self.cfg.overhead_s / 2
            if again < self.cfg.duration_s:
                self._push(again, _ISSUE, None)

    # -- the worker ----------------------------------------------------------------------
    def _room(self, lane: _Lane) -> bool:
        """Whether the worker fetches another request: it holds fewer than ``max_pending``
        and the requests' level is below its ``max_queue_size`` (``level_room``)."""
        if len(lane.batcher) + lane.in_flight >= self.cfg.max_pending:
            return False
        return lane.batcher.level_room(self._level) != 0

    def _refill(self, lane: _Lane) -> bool:
        """Fetch from the lane's lag while the worker has room; whether any was fetched."""
        head = lane.lag_head
        while lane.lag_len and self._room(lane):
            lane.batcher.add(lane.lag[lane.lag_head], size=self.cfg.rows_per_request)
            lane.lag_head += 1
        fetched = lane.lag_head > head
        if lane.lag_head > 4096 and lane.lag_head * 2 > len(lane.lag):
            del lane.lag[: lane.lag_head]
            lane.lag_head = 0
        return fetched

    def _dispatch(self, lane: _Lane) -> None:
        now = self.clock.now
        while lane.free > 0:
            decision = lane.batcher.decide(backlog=lane.lag_len * self.cfg.rows_per_request)
            for rid in decision.expired:
                self.done[rid] = float("nan")
                self.expired += 1
                self._waiting -= 1
                self._answered(now)
            if decision.batch:
                self._start(lane, decision.batch)
                continue
            if decision.expired and self._refill(lane):
                continue  # the expired ones made room: decide again with what was fetched
            if decision.wake_at is not None:
                lane.wake_token += 1
                self._push(max(decision.wake_at, now + 1e-9), _WAKE, (lane, lane.wake_token))
            break
        self._note_depth()

    def _start(self, lane: _Lane, batch: list[int]) -> None:
        now = self.clock.now
        rows = len(batch) * self.cfg.rows_per_request
        lane.free -= 1
        lane.in_flight += len(batch)
        self._waiting -= len(batch)
        self._batches.append((now, rows))
        self._push(now + self.cfg.latency.batch_latency_s(rows), _DONE, (lane, batch, now))
        self._refill(lane)

    def _note_depth(self) -> None:
        if self._depth[-1][1] != self._waiting:
            self._depth.append((self.clock.now, self._waiting))

    # -- results -------------------------------------------------------------------------
    def _result(self, *, truncated: bool) -> SimResult:
        cfg = self.cfg
        lo, hi = cfg.warmup_s, cfg.duration_s
        per_s = math.nan if truncated else 1.0  # no rate over a window not run to its end
        end = min(hi, self.clock.now) if truncated else hi
        issued, arrived, done = (np.asarray(v) for v in (self.issued, self.arrived, self.done))
        half = cfg.overhead_s / 2
        answered = done + half
        finished = ~np.isnan(done)
        in_window = finished & (answered >= lo) & (answered < hi)
        sent_in_window = finished & (issued >= lo) & (issued < hi)
        sizes = [rows for t, rows in self._batches if lo <= t < hi]
        depth_mean, depth_max = _depth_stats(self._depth, lo, end)
        window = hi - lo
        return SimResult(
            throughput=per_s * float(in_window.sum()) / window,
            completed=int(in_window.sum()),
            expired=self.expired,
            latency=summarize((answered - issued)[sent_in_window]),
            server_latency=summarize((done - arrived)[sent_in_window]),
            batch_sizes=size_histogram(sizes),
            mean_batch=mean_batch_size(sizes),
            depth_mean=depth_mean,
            depth_max=depth_max,
            depth_series=_sample_steps(self._depth, hi, cfg.depth_points),
            utilization=[
                per_s * lane.busy_s / (window * (cfg.instances if cfg.routing == "shared" else 1))
                for lane in self.lanes
            ],
            unfinished=int((~finished).sum()) - self.expired,
            truncated=truncated,
            simulated_s=self.clock.now,
        )


def simulate(config: SimConfig) -> SimResult:
    """Run one simulation (see ``Simulator``)."""
    return Simulator(config).run()


def _check_policy(policy: BatchingPolicy, rows: int) -> None:
    """A policy a worker could run, and requests that fit in one of its batches."""
    top = policy.max_batch_size
    if top < 1:
        raise ValueError(f"max_batch_size must be >= 1, got {top}")
    if policy.max_queue_delay_us < 0:
        raise ValueError(f"max_queue_delay_us must be >= 0, got {policy.max_queue_delay_us}")
    if any(not 1 <= n <= top for n in policy.preferred_batch_sizes):
        raise ValueError(f"preferred batch sizes must be in 1..max_batch_size ({top})")
    if not 1 <= rows <= top:
        raise ValueError(f"rows per request must be in 1..max_batch_size ({top}), got {rows}")


def _overlap(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def _depth_stats(steps: list[tuple[float, int]], lo: float, hi: float) -> tuple[float, int]:
    """Time-weighted mean and max of a step function over [lo, hi) (NaN mean if empty)."""
    if hi <= lo:
        return math.nan, 0
    total, peak = 0.0, 0
    for (t0, value), (t1, _) in zip(steps, [*steps[1:], (float("inf"), 0)], strict=True):
        span = _overlap(t0, t1, lo, hi)
        if span > 0:
            total += span * value
            peak = max(peak, value)
    return total / (hi - lo), peak


def _sample_steps(
    steps: list[tuple[float, int]], until: float, points: int
) -> list[tuple[float, int]]:
    """The step function's value at ``points`` evenly spaced times in [0, until]."""
    times = np.linspace(0.0, until, max(2, points))
    starts = np.asarray([t for t, _ in steps])
    idx = np.searchsorted(starts, times, side="right") - 1
    return [(round(float(t), 6), steps[int(i)][1]) for t, i in zip(times, idx, strict=True)]
