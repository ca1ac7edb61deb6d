"""What the benchmarks share: their context (services, processes, folders) and helpers for
side-by-side measurement (interleaved rounds, paired ratios, CPU accounting, raw ORT)."""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from plaza.loadgen.inputs import InputSet
from plaza.loadgen.measure import Load, PointResult, WindowConfig, measure
from plaza.loadgen.raw_backend import open_session, time_window
from plaza.loadgen.stack import ConfigEdit, copy_model, warm_up
from plaza.loadgen.targets import Target
from plaza.repository import ModelRepository
from plaza.stack import (
    Deployment,
    GatewayProcess,
    ProcessGroup,
    Services,
    WorkerProcess,
    free_port,
    new_prefix,
    wait_workers,
)


@dataclass
class Context:
    """One suite run: shared services, child processes, where things go, how long to measure."""

    repository: Path
    work: Path
    out_dir: Path
    services: Services
    procs: ProcessGroup
    quick: bool = False
    notes: list[str] = field(default_factory=list)
    kafka_warmed: bool = False
    """Whether ``warm_kafka`` ran in this suite run (once is enough)."""

    @property
    def rounds(self) -> int:
        return 1 if self.quick else 2

    def window(self, **overrides: Any) -> WindowConfig:
        base = (
            WindowConfig(window_s=1.0, warmup_s=0.5, max_windows=4)
            if self.quick
            else WindowConfig(window_s=2.0, warmup_s=1.0, max_windows=6)
        )
        return dataclasses.replace(base, **overrides)

    def deployment(
        self, name: str, models: Mapping[str, ConfigEdit | None], partitions: int = 4
    ) -> Deployment:
        """A fresh Plaza (own prefix, own repository folder holding only ``models``)."""
        prefix = new_prefix(name)
        repo = self.work / prefix / "repository"
        for model, edit in models.items():
            copy_model(self.repository, repo, model, edit)
        return self.services.deployment(repo, prefix, partitions=partitions, log_level="WARNING")


def spec_of(dep: Deployment, model: str) -> Any:
    return ModelRepository(dep.repository).spec(model)


async def start_workers(
    ctx: Context,
    dep: Deployment,
    model: str,
    pool: Sequence[InputSet],
    count: int = 1,
    env: Mapping[str, str] | None = None,
) -> list[Any]:
    """``count`` worker processes of ``model`` (``env``: settings), up, with their
    partitions, warmed."""
    log_dir = ctx.procs.log_dir
    procs = [
        ctx.procs.start(
            WorkerProcess(dep, model, log_dir, name=f"{dep.prefix}-worker-{model}-{i}", env=env)
        )
        for i in range(count)
    ]
    await wait_workers(dep, model, count, ctx.procs)
    await warm_up(dep, model, pool, workers=count)
    return procs


KAFKA_WARM_UP_ROUNDS = 2
KAFKA_WARM_UP_CONCURRENCY = 64


async def warm_kafka(ctx: Context, dep: Deployment, model: str, pool: Sequence[InputSet]) -> None:
    """Unmeasured load on the Kafka path of a started worker of ``model``, once per suite
    run, before a case measures at low concurrency: a broker that has just started spends
    milliseconds of CPU per operation compiling its hot paths, for tens of thousands of
    operations (docs/benchmarks.md, "Kafka's broker per operation"), which the first
    points measured would pay."""
    if ctx.kafka_warmed:
        return
    from plaza.loadgen.targets import KafkaTarget

    target = KafkaTarget(dep.settings(), model, pool, label="kafka warm-up")
    await target.start()
    try:
        for _ in range(KAFKA_WARM_UP_ROUNDS):
            await measure(target, Load("concurrency", KAFKA_WARM_UP_CONCURRENCY), ctx.window())
    finally:
        await target.stop()
    ctx.kafka_warmed = True


async def start_gateway(ctx: Context, dep: Deployment, workers: int = 1) -> tuple[str, Any]:
    """A gateway of ``dep`` (``workers`` processes on its ports), ready."""
    gateway = GatewayProcess(
        dep,
        free_port(),
        ctx.procs.log_dir,
        name=f"{dep.prefix}-gateway-{workers}",
        env={"PLAZA_GATEWAY__WORKERS": str(workers)},
    )
    ctx.procs.start(gateway)
    await gateway.wait_ready()
    return gateway.url, gateway


async def measure_rounds(
    targets: Mapping[str, Target], load: Load, cfg: WindowConfig, rounds: int
) -> dict[str, list[PointResult]]:
    """Each round measures every target once, in turn (side by side)."""
    out: dict[str, list[PointResult]] = {label: [] for label in targets}
    for target in targets.values():
        await target.start()
    try:
        for _ in range(rounds):
            for label, target in targets.items():
                out[label].append(await measure_logged(target, load, cfg))
    finally:
        for target in targets.values():
            await target.stop()
    return out


async def measure_logged(target: Target, load: Load, cfg: WindowConfig) -> PointResult:
    """``measure``, printing a line when the point is done (the suite runs for minutes)."""
    started = time.monotonic()
    p = await measure(target, load, cfg)
    print(
        f"   {target.label} {load.label}: {p.throughput:.0f}/s, p50 {p.latency.p50_ms:.2f} ms, "
        f"p99 {p.latency.p99_ms:.2f} ms, batch {p.mean_batch:.1f}, {len(p.windows)} windows"
        f"{'' if p.stable else ' (not stable)'}, {time.monotonic() - started:.0f} s",
        flush=True,
    )
    return p


def paired_ratio(
    a: Sequence[PointResult],
    b: Sequence[PointResult],
    value: Callable[[PointResult], float] = lambda p: p.throughput,
) -> float:
    """Median over rounds of value(a_i) / value(b_i)."""
    ratios = [value(x) / value(y) for x, y in zip(a, b, strict=True) if value(y) > 0]
    return statistics.median(ratios) if ratios else float("nan")


def median_of(points: Sequence[PointResult], value: Callable[[PointResult], float]) -> float:
    values = [value(p) for p in points if not np.isnan(value(p))]
    return statistics.median(values) if values else float("nan")


def point_summary(p: PointResult) -> dict[str, Any]:
    return {
        "throughput": round(p.throughput, 1),
        "p50_ms": round(p.latency.p50_ms, 3),
        "p99_ms": round(p.latency.p99_ms, 3),
        "mean_batch": round(p.mean_batch, 2),
        "batch_source": p.batch_source,
        "model_busy": round(p.model_busy, 3),
        "server": p.server.as_dict() if p.server else None,
        "errors": p.errors,
        "stable": p.stable,
    }


# -- CPU time ----------------------------------------------------------------------------------

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU of a process (all its threads); ours when ``pid`` is None."""
    if pid is None or pid == os.getpid():
        t = os.times()
        return t.user + t.system
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / _TICKS


def tree_cpu_seconds(pid: int | None) -> float:
    """``cpu_seconds`` of a process and all its descendants (a gateway with workers)."""
    if pid is None:
        return float("nan")
    return sum(cpu_seconds(p) for p in descendants(pid))


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (from /proc's children lists)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


# -- the model alone -------------------------------------------------------------------------


def raw_session(dep: Deployment, model: str, threads: int = 0) -> Any:
    """An ONNX Runtime session configured like a worker's (threads 0: every core)."""
    mv = ModelRepository(dep.repository).served_versions(model)[-1]
    return open_session(mv.path, threads or (os.cpu_count() or 1))


def raw_items_per_s(session: Any, feeds: InputSet, rows: int, window_s: float) -> float:
    """Items per second running ``feeds`` back to back for ``window_s``."""
    runs, elapsed = time_window(session, feeds, window_s)
    return runs * rows / elapsed


def raw_call_latencies(session: Any, feeds: InputSet, window_s: float) -> list[float]:
    """Seconds per call, each timed on its own, for ``window_s``."""
    times: list[float] = []
    end = time.perf_counter() + window_s
    while time.perf_counter() < end or len(times) < 10:
        t0 = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - t0)
    return times


def stack_rows(pool: Sequence[InputSet], rows: int) -> InputSet:
    """``rows`` rows made of the pool's one-row inputs, cycled (a batch as a worker stacks)."""
    names = list(pool[0])
    picks = [pool[i % len(pool)] for i in range(rows)]
    return {n: np.concatenate([p[n] for p in picks], axis=0) for n in names}
