"""The benchmarks of issue 12 ("beat the private lane"): ONNX Runtime's spinning on and off,
and Triton's perf_analyzer against the naive server and Plaza (HTTP, gRPC; 1 and 2 gateway
processes). Both also say where the CPU went: seconds of CPU per request of each process.
"""

from __future__ import annotations

import asyncio
import contextlib
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
    warm_kafka,
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


# -- worker settings: one setting, two values side by side ---------------------------------

SPIN_ENV = {
    "on": {"PLAZA_WORKER__ORT_INTRA_OP_SPINNING": "1", "PLAZA_WORKER__ORT_INTER_OP_SPINNING": "1"},
    "off": {"PLAZA_WORKER__ORT_INTRA_OP_SPINNING": "0", "PLAZA_WORKER__ORT_INTER_OP_SPINNING": "0"},
}
THREADS_ENV = {
    "all cores": {"PLAZA_WORKER__INTRA_OP_THREADS": "0"},
    "1 thread": {"PLAZA_WORKER__INTRA_OP_THREADS": "1"},
}


DELAY_FROM_ENV = {
    "fetched": {"PLAZA_WORKER__QUEUE_DELAY_FROM": "fetched"},
    "sent": {"PLAZA_WORKER__QUEUE_DELAY_FROM": "sent"},
}


async def queue_delay_from(ctx: Context) -> Report:
    """MLP (``max_queue_delay_microseconds`` 2000), one worker counting the delay from when
    it fetched a request and one from when the request was sent to Kafka (the default), as
    ``ort_spinning`` measures."""
    return await worker_setting_ab(ctx, "delay-from", DELAY_FROM_ENV)


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
    await warm_kafka(ctx, deps[first], model, pool)  # the broker both sides share
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


@dataclass(frozen=True)
class PerfLane:
    """One server perf_analyzer drives: where, how, and whose CPU and requests count."""

    address: str
    protocol: perf_analyzer.Protocol
    pids: Mapping[str, int | None]
    stats_address: str
    """The HTTP host:port whose statistics count this lane's requests."""


async def perf_analyzer_lanes(ctx: Context) -> Report:
    """Triton's perf_analyzer (sync; HTTP JSON and gRPC) on MLP at c = 1, 16, 64: the naive
    server (HTTP and gRPC) against Plaza with 1 and 2 gateway processes, and the fronts'
    ceiling (a server with one canned answer); ratios to the naive server; CPU/request,
    perf_analyzer's own included."""
    version = perf_analyzer.check_installed()
    model = "mlp"
    dep = ctx.deployment("pa", {model: None})
    pool = input_pool(spec_of(dep, model))
    data = perf_analyzer.write_input_data(pool, ctx.work / "perf_analyzer_input.json")
    worker = (await start_workers(ctx, dep, model, pool))[0]
    gw1, grpc1 = await _gateway(ctx, dep, 1)
    gw2, grpc2 = await _gateway(ctx, dep, 2)
    naive = await _baseline_server(ctx, dep, model, spinning=True, grpc=True)
    calm = await _baseline_server(ctx, dep, model, spinning=False)
    canned = await _baseline_server(ctx, dep, model, spinning=False, grpc=True, canned=True)
    host = "127.0.0.1"

    def plaza(address: str, protocol: perf_analyzer.Protocol, gateway: Any) -> PerfLane:
        pids = {"worker": worker.pid, "gateway": gateway.pid}
        return PerfLane(address, protocol, pids, f"{host}:{gw1.port}")

    lanes: dict[str, PerfLane] = {
        "naive http": naive.lane("http"),
        "naive grpc": naive.lane("grpc"),
        "naive http, no spinning": calm.lane("http"),
        "plaza http": plaza(f"{host}:{gw1.port}", "http", gw1),
        "plaza grpc": plaza(grpc1, "grpc", gw1),
        "plaza http, 2 gateways": plaza(f"{host}:{gw2.port}", "http", gw2),
        "plaza grpc, 2 gateways": plaza(grpc2, "grpc", gw2),
        "canned http": canned.lane("http"),
        "canned grpc": canned.lane("grpc"),
    }
    interval_ms = 1000 if ctx.quick else 2000
    report: Report = {
        "model": model,
        "perf_analyzer": version,
        "mode": f"sync, HTTP JSON tensors / gRPC, {perf_analyzer.WINDOWS} windows of "
        f"{interval_ms} ms, stability check off, after {WARM_UP_ROUNDS} unmeasured c="
        f"{WARM_UP_CONCURRENCY} runs on plaza http and on plaza grpc",
        "cores": os.cpu_count() or 1,
        "runs": {},
        "ratios": {},
    }
    try:
        await _warm_up(model, lanes, data, interval_ms)
        for c in CONCURRENCIES:
            for name, lane in lanes.items():
                try:
                    run = await _perf_run(ctx, model, lane, c, data, interval_ms)
                except RuntimeError as exc:  # one lost run: recorded, the others still run
                    report["runs"][f"{name} c{c}"] = {"error": str(exc)[-300:]}
                    print(f"   perf_analyzer {name} c={c}: FAILED {exc}", flush=True)
                    continue
                report["runs"][f"{name} c{c}"] = run
                print(
                    f"   perf_analyzer {name} c={c}: {run['throughput']:.0f}/s, "
                    f"p50 {run['p50_ms']:.2f} ms, p99 {run['p99_ms']:.2f} ms, "
                    f"cpu/request {run['cpu_us_per_request']} us",
                    flush=True,
                )
    finally:
        ctx.procs.stop([canned.proc, naive.proc, calm.proc, gw2, gw1, worker])
    report["ratios"] = _lane_ratios(report["runs"], lanes, report["cores"])
    return report


WARM_UP_CONCURRENCY = 64
WARM_UP_ROUNDS = 2
"""Unmeasured runs on each Plaza lane with one gateway before the measured ones."""


async def _warm_up(model: str, lanes: Mapping[str, PerfLane], data: Any, interval_ms: int) -> None:
    """``WARM_UP_ROUNDS`` unmeasured runs on each Plaza lane with one gateway, at
    ``WARM_UP_CONCURRENCY``: a broker that has just started spends milliseconds of CPU per
    request compiling its hot paths (scripts/kafka_op_cost.py: 1.4 to 1.9 ms of broker CPU
    per produce on a fresh JVM, 0.18 to 0.34 ms some 10,000 to 40,000 operations later),
    which the first lanes measured would pay."""
    for name in ("plaza http", "plaza grpc") * WARM_UP_ROUNDS:
        lane = lanes[name]
        with contextlib.suppress(RuntimeError):  # a warm-up that fails only warms less
            await asyncio.to_thread(
                perf_analyzer.run,
                model,
                lane.address,
                lane.protocol,
                WARM_UP_CONCURRENCY,
                data,
                interval_ms,
            )


async def _perf_run(
    ctx: Context, model: str, lane: PerfLane, c: int, data: Any, interval_ms: int
) -> dict[str, Any]:
    """One perf_analyzer run on ``lane`` at concurrency ``c``, with CPU per request of the
    lane's processes, Kafka's and Redis's, and perf_analyzer's own (``client``)."""
    meter = CpuMeter({**lane.pids, **service_pids(ctx)})
    count = _request_counter(lane.stats_address)
    before = await count(model)
    meter.start()
    result = await asyncio.to_thread(
        perf_analyzer.run, model, lane.address, lane.protocol, c, data, interval_ms
    )
    meter_end = meter.snapshot()
    await asyncio.sleep(STATS_FLUSH_S)  # the workers' statistics reach Redis
    requests = await count(model) - before
    cpu = meter.stop(requests, meter_end)
    cpu["client"] = round(result.cpu_s / max(1, requests) * 1e6, 1)
    return {**result.as_dict(), "requests": requests, "cpu_us_per_request": cpu}


@dataclass(frozen=True)
class _BaselineProcess:
    proc: Any
    http_port: int
    grpc_port: int | None

    def lane(self, protocol: perf_analyzer.Protocol) -> PerfLane:
        port = self.http_port if protocol == "http" else self.grpc_port
        if port is None:
            raise ValueError("this baseline server has no gRPC port")
        http = f"127.0.0.1:{self.http_port}"
        return PerfLane(f"127.0.0.1:{port}", protocol, {"server": self.proc.pid}, http)


async def _baseline_server(
    ctx: Context,
    dep: Any,
    model: str,
    spinning: bool,
    grpc: bool = False,
    canned: bool = False,
) -> _BaselineProcess:
    """loadgen's baseline server of ``model`` on free ports (gRPC too with ``grpc``; one
    canned answer with ``canned``), ready."""
    port, grpc_port = free_port(), (free_port() if grpc else None)
    argv = ["-m", "plaza.loadgen.baseline_server", "--model", model]
    argv += ["--repository", str(dep.repository), "--port", str(port)]
    argv += ["--threads", str(os.cpu_count() or 1), *([] if spinning else ["--no-spinning"])]
    argv += [*(["--grpc-port", str(grpc_port)] if grpc_port else []), *(["--canned"] * canned)]
    kind = "canned" if canned else "baseline" if spinning else "baseline-nospin"
    proc = ctx.procs.spawn(f"{dep.prefix}-{kind}", argv, dep.env())
    await wait_http_ready(http_url(port), ctx.procs)
    return _BaselineProcess(proc, port, grpc_port)


def _lane_ratios(runs: Mapping[str, Any], lanes: Mapping[str, Any], cores: int) -> dict[str, float]:
    """Each lane against ``naive http`` at each concurrency, and the client-only bound:
    the requests per second that perf_analyzer's own CPU per request leaves possible on
    ``cores`` cores were the server free, against the naive server's. A failed run (no
    ``throughput``) has no ratios."""
    out: dict[str, float] = {}
    for c in CONCURRENCIES:
        naive = runs.get(f"naive http c{c}", {})
        if "throughput" not in naive:
            continue
        for lane in lanes:
            run = runs.get(f"{lane} c{c}", {})
            if lane == "naive http" or "throughput" not in run:
                continue
            out[f"c{c} {lane} / naive infer/s"] = run["throughput"] / max(1e-9, naive["throughput"])
            out[f"c{c} {lane} / naive p50"] = run["p50_ms"] / max(1e-9, naive["p50_ms"])
            out[f"c{c} {lane} / naive p99"] = run["p99_ms"] / max(1e-9, naive["p99_ms"])
        for protocol in ("http", "grpc"):
            canned = runs.get(f"canned {protocol} c{c}", {})
            if canned.get("cpu_us_per_request", {}).get("client"):
                bound = cores * 1e6 / canned["cpu_us_per_request"]["client"]
                out[f"c{c} client-only bound {protocol} / naive infer/s"] = bound / max(
                    1e-9, naive["throughput"]
                )
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
