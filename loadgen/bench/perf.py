"""The benchmarks of issue 12 ("beat the private lane"): ONNX Runtime's spinning on and off,
and Triton's perf_analyzer against the naive server and Plaza (HTTP, gRPC; 1 and 2 gateway
processes). Both also say where the CPU went: seconds of CPU per request of each process.
"""

from __future__ import annotations

import asyncio
import os
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from plaza.loadgen import perf_analyzer
from plaza.loadgen.bench.context import (
    Context,
    cpu_seconds,
    measure_logged,
    point_summary,
    spec_of,
    start_workers,
    tree_cpu_seconds,
)
from plaza.loadgen.inputs import input_pool
from plaza.loadgen.measure import Load, PointResult
from plaza.loadgen.targets import HttpTarget, KafkaTarget, Target
from plaza.stack import GatewayProcess, free_port, http_url, wait_http_ready

Report = dict[str, Any]
CONCURRENCIES = (1, 16, 64)
STATS_FLUSH_S = 1.5
"""Longer than a bench worker's statistics flush (its heartbeat, 0.5 s)."""


@dataclass
class CpuMeter:
    """CPU seconds of named processes (None: this one) between ``start`` and ``stop``."""

    pids: Mapping[str, int | None]
    _before: dict[str, float] | None = None

    def start(self) -> None:
        self._before = self.snapshot()

    def snapshot(self) -> dict[str, float]:
        return {k: self._read(pid) for k, pid in self.pids.items()}

    def stop(self, requests: int, after: dict[str, float] | None = None) -> dict[str, float]:
        """Microseconds of CPU per request of each process from ``start`` to now (or to
        the ``snapshot`` ``after``)."""
        assert self._before is not None
        after = after or self.snapshot()
        return {
            k: round((after[k] - self._before[k]) / max(1, requests) * 1e6, 1) for k in self.pids
        }

    @staticmethod
    def _read(pid: int | None) -> float:
        return cpu_seconds(None) if pid is None else tree_cpu_seconds(pid)


def service_pids(ctx: Context) -> dict[str, int | None]:
    """Kafka's and Redis's pids when this suite started them (else they are not counted)."""
    svc, out = ctx.services, {}
    if svc.kafka is not None and svc.kafka.pid(0) is not None:
        out["kafka"] = svc.kafka.pid(0)
    if svc.redis is not None and svc.redis.pid is not None:
        out["redis"] = svc.redis.pid
    return out


# -- ONNX Runtime settings: one worker setting, two values side by side --------------------

SPIN_ENV = {
    "on": {"PLAZA_WORKER__ORT_INTRA_OP_SPINNING": "1", "PLAZA_WORKER__ORT_INTER_OP_SPINNING": "1"},
    "off": {"PLAZA_WORKER__ORT_INTRA_OP_SPINNING": "0", "PLAZA_WORKER__ORT_INTER_OP_SPINNING": "0"},
}
THREADS_ENV = {
    "all cores": {"PLAZA_WORKER__INTRA_OP_THREADS": "0"},
    "1 thread": {"PLAZA_WORKER__INTRA_OP_THREADS": "1"},
}


async def ort_spinning(ctx: Context) -> Report:
    """MLP, one worker with ONNX Runtime's thread spinning on and one with it off, each with
    its gateway; HTTP JSON and Kafka at c = 1, 16, 64, interleaved; CPU per request."""
    return await worker_setting_ab(ctx, "spin", SPIN_ENV)


async def ort_threads(ctx: Context) -> Report:
    """MLP, one worker with ONNX Runtime's intra-op pool on every core (the default) and one
    with a single intra-op thread (spinning off in both), as ``ort_spinning`` measures."""
    return await worker_setting_ab(ctx, "threads", THREADS_ENV)


async def worker_setting_ab(
    ctx: Context, name: str, sides: Mapping[str, Mapping[str, str]]
) -> Report:
    """Two mlp deployments whose workers differ only by ``sides``' environment (the first
    side is the reference), each with its gateway; HTTP JSON and Kafka at c = 1, 16, 64,
    ``ctx.rounds`` interleaved rounds. Ratios: the median over rounds of second / first."""
    model = "mlp"
    first, second = sides
    deps = {side: ctx.deployment(f"{name}-{i}", {model: None}) for i, side in enumerate(sides)}
    pool = input_pool(spec_of(deps[first], model))
    workers, gateways = {}, {}
    for side, dep in deps.items():
        workers[side] = (await start_workers(ctx, dep, model, pool, env=dict(sides[side])))[0]
        gateways[side] = await _gateway(ctx, dep, 1)
    report: Report = {"model": model, "sides": list(sides), "points": {}, "ratios": {}}
    try:
        for c in CONCURRENCIES:
            for path in ("http-json", "kafka"):
                report["points"][f"{path} c{c}"] = await _side_by_side(
                    ctx, deps, workers, gateways, path, c, pool
                )
    finally:
        ctx.procs.stop([*workers.values(), *(g for g, _ in gateways.values())])
    figures: dict[str, Callable[[dict[str, Any]], float]] = {
        "throughput": lambda r: r["throughput"],
        "p50": lambda r: r["p50_ms"],
        "worker cpu/request": lambda r: r["cpu_us_per_request"]["worker"],
        "gateway cpu/request": lambda r: r["cpu_us_per_request"]["gateway"],
    }
    for key, rounds in report["points"].items():
        for figure, value in figures.items():
            pairs = zip(rounds[second], rounds[first], strict=True)
            ratios = [value(b) / value(a) for b, a in pairs if value(a) > 0]
            report["ratios"][f"{key} {figure} {second}/{first}"] = (
                statistics.median(ratios) if ratios else float("nan")
            )
    return report


async def _side_by_side(
    ctx: Context,
    deps: Mapping[str, Any],
    workers: Mapping[str, Any],
    gateways: Mapping[str, tuple[GatewayProcess, str]],
    path: str,
    c: int,
    pool: Any,
) -> dict[str, Any]:
    """Every side at one load point, ``ctx.rounds`` interleaved rounds: each side's figures
    per round."""
    out: dict[str, list[dict[str, Any]]] = {side: [] for side in deps}
    for _ in range(ctx.rounds):
        for side in deps:
            gateway, _ = gateways[side]
            target: Target = (
                KafkaTarget(deps[side].settings(), "mlp", pool, label=f"kafka {side}")
                if path == "kafka"
                else HttpTarget(
                    gateway.url,
                    "mlp",
                    pool,
                    binary=False,
                    max_connections=c,
                    label=f"http-json {side}",
                )
            )
            meter = CpuMeter({"worker": workers[side].pid, "gateway": gateway.pid})
            await target.start()
            try:
                meter.start()
                point = await measure_logged(target, Load("concurrency", c), ctx.window())
                cpu = meter.stop(point.total_ok)
            finally:
                await target.stop()
            out[side].append({**_brief(point), "cpu_us_per_request": cpu})
    return out


def _brief(p: PointResult) -> dict[str, Any]:
    s = point_summary(p)
    return {k: s[k] for k in ("throughput", "p50_ms", "p99_ms", "mean_batch", "errors")}


async def _gateway(ctx: Context, dep: Any, workers: int) -> tuple[GatewayProcess, str]:
    """A gateway of ``dep`` with ``workers`` processes, ready; (process, gRPC address)."""
    grpc_port = free_port()
    gateway = GatewayProcess(
        dep,
        free_port(),
        ctx.procs.log_dir,
        name=f"{dep.prefix}-gateway-x{workers}",
        grpc_port=grpc_port,
        env={"PLAZA_GATEWAY__WORKERS": str(workers)},
    )
    ctx.procs.start(gateway)
    await gateway.wait_ready()
    return gateway, f"127.0.0.1:{grpc_port}"


# -- perf_analyzer ---------------------------------------------------------------------------


async def perf_analyzer_lanes(ctx: Context) -> Report:
    """Triton's perf_analyzer (sync; HTTP JSON and gRPC) on MLP at c = 1, 16, 64: the naive
    server against Plaza with 1 and 2 gateway processes; ratios Plaza/naive; CPU/request."""
    version = perf_analyzer.check_installed()
    model = "mlp"
    dep = ctx.deployment("pa", {model: None})
    pool = input_pool(spec_of(dep, model))
    data = perf_analyzer.write_input_data(pool, ctx.work / "perf_analyzer_input.json")
    worker = (await start_workers(ctx, dep, model, pool))[0]
    gw1, grpc1 = await _gateway(ctx, dep, 1)
    gw2, grpc2 = await _gateway(ctx, dep, 2)
    naive_port, naive = await _naive_server(ctx, dep, model, spinning=True)
    calm_port, calm = await _naive_server(ctx, dep, model, spinning=False)
    host = "127.0.0.1"
    lanes: dict[str, tuple[str, perf_analyzer.Protocol, dict[str, int | None]]] = {
        "naive http": (f"{host}:{naive_port}", "http", {"server": naive.pid}),
        "naive http, no spinning": (f"{host}:{calm_port}", "http", {"server": calm.pid}),
        "plaza http": (f"{host}:{gw1.port}", "http", {"worker": worker.pid, "gateway": gw1.pid}),
        "plaza grpc": (grpc1, "grpc", {"worker": worker.pid, "gateway": gw1.pid}),
        "plaza http, 2 gateways": (
            f"{host}:{gw2.port}",
            "http",
            {"worker": worker.pid, "gateway": gw2.pid},
        ),
        "plaza grpc, 2 gateways": (grpc2, "grpc", {"worker": worker.pid, "gateway": gw2.pid}),
    }
    interval_ms = 1000 if ctx.quick else 2000
    report: Report = {
        "model": model,
        "perf_analyzer": version,
        "mode": f"sync, HTTP JSON tensors / gRPC, {perf_analyzer.WINDOWS} windows of "
        f"{interval_ms} ms, stability check off",
        "runs": {},
        "ratios": {},
    }
    try:
        for c in CONCURRENCIES:
            for lane, (address, protocol, pids) in lanes.items():
                meter = CpuMeter({**pids, **service_pids(ctx)})
                count = _request_counter(address if protocol == "http" else f"{host}:{gw1.port}")
                before = await count(model)
                meter.start()
                result = await asyncio.to_thread(
                    perf_analyzer.run, model, address, protocol, c, data, interval_ms
                )
                meter_end = meter.snapshot()
                await asyncio.sleep(STATS_FLUSH_S)  # the workers' statistics reach Redis
                requests = await count(model) - before
                run = {**result.as_dict(), "cpu_us_per_request": meter.stop(requests, meter_end)}
                report["runs"][f"{lane} c{c}"] = run
                print(
                    f"   perf_analyzer {lane} c={c}: {result.throughput:.0f}/s, "
                    f"p50 {result.p50_ms:.2f} ms, p99 {result.p99_ms:.2f} ms, "
                    f"cpu/request {run['cpu_us_per_request']} us",
                    flush=True,
                )
    finally:
        ctx.procs.stop([naive, calm, gw2, gw1, worker])
    report["ratios"] = _lane_ratios(report["runs"], lanes)
    return report


async def _naive_server(ctx: Context, dep: Any, model: str, spinning: bool) -> tuple[int, Any]:
    """loadgen's baseline server of ``model`` on a free port, ready: (port, process)."""
    port = free_port()
    argv = ["-m", "plaza.loadgen.baseline_server", "--model", model]
    argv += ["--repository", str(dep.repository), "--port", str(port)]
    argv += ["--threads", str(os.cpu_count() or 1), *([] if spinning else ["--no-spinning"])]
    name = f"{dep.prefix}-baseline{'' if spinning else '-nospin'}"
    proc = ctx.procs.spawn(name, argv, dep.env())
    await wait_http_ready(http_url(port), ctx.procs)
    return port, proc


def _lane_ratios(runs: Mapping[str, Any], lanes: Mapping[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for c in CONCURRENCIES:
        naive = runs[f"naive http c{c}"]
        for lane in lanes:
            if lane == "naive http":
                continue
            run = runs[f"{lane} c{c}"]
            out[f"c{c} {lane} / naive infer/s"] = run["throughput"] / max(1e-9, naive["throughput"])
            out[f"c{c} {lane} / naive p50"] = run["p50_ms"] / max(1e-9, naive["p50_ms"])
            out[f"c{c} {lane} / naive p99"] = run["p99_ms"] / max(1e-9, naive["p99_ms"])
    return out


def _request_counter(http_address: str) -> Callable[[str], Any]:
    """Successful requests so far, from Triton's statistics extension at ``http_address``
    (Plaza's gateway sums its workers'; the naive server counts its own)."""
    import httpx

    async def count(model: str) -> int:
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.get(f"http://{http_address}/v2/models/{model}/stats")
            response.raise_for_status()
            stats = response.json()["model_stats"]
        return sum(int(s["inference_stats"]["success"]["count"]) for s in stats)

    return count
