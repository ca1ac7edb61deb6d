"""The benchmarks of ``python -m plaza.loadgen.bench``; each returns a JSON-able report.

Every figure that is compared is measured side by side in the same run (interleaved
rounds where the two sides can both be up), and reported as a ratio: the machine is shared.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Awaitable, Callable
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from plaza.batching import BatchingPolicy
from plaza.loadgen.arrivals import ArrivalProcess
from plaza.loadgen.bench.context import (
    Context,
    cpu_seconds,
    measure_logged,
    measure_rounds,
    median_of,
    paired_ratio,
    point_summary,
    raw_call_latencies,
    raw_items_per_s,
    raw_session,
    spec_of,
    stack_rows,
    start_gateway,
    start_workers,
    warm_kafka,
)
from plaza.loadgen.bench.ensemble_streaming import ensemble_streaming
from plaza.loadgen.bench.pipeline import text_embed
from plaza.loadgen.bench.streaming import streaming
from plaza.loadgen.inputs import input_pool, text_pool
from plaza.loadgen.latency import LinearLatency
from plaza.loadgen.measure import Load, PointResult
from plaza.loadgen.simulator import SimConfig, simulate
from plaza.loadgen.stack import chain, set_parameters
from plaza.loadgen.summary import summarize
from plaza.loadgen.targets import HttpTarget, KafkaTarget, Target
from plaza.stack import free_port, http_url, wait_http_ready

Report = dict[str, Any]
Benchmark = Callable[[Context], Awaitable[Report]]


def max_batch_size_one(config: mc.ModelConfig) -> None:
    config.max_batch_size = 1
    del config.dynamic_batching.preferred_batch_size[:]


def no_queue_delay(config: mc.ModelConfig) -> None:
    config.dynamic_batching.max_queue_delay_microseconds = 0
    del config.dynamic_batching.preferred_batch_size[:]


def max_batch(size: int) -> Callable[[mc.ModelConfig], None]:
    def edit(config: mc.ModelConfig) -> None:
        config.max_batch_size = size

    return edit


# -- batching gain ---------------------------------------------------------------------------


async def batching(ctx: Context) -> Report:
    """MLP at concurrency 64 through Kafka: dynamic batching vs a max_batch_size 1 copy,
    next to ONNX Runtime's own gain at the batch size Plaza formed."""
    model = "mlp"
    dyn = ctx.deployment("batching-dynamic", {model: None})
    one = ctx.deployment("batching-mbs1", {model: max_batch_size_one})
    pool = input_pool(spec_of(dyn, model))
    procs = [
        *await start_workers(ctx, dyn, model, pool),
        *await start_workers(ctx, one, model, pool),
    ]
    targets: dict[str, Target] = {
        "dynamic": KafkaTarget(dyn.settings(), model, pool, label="dynamic"),
        "mbs1": KafkaTarget(one.settings(), model, pool, label="max_batch_size 1"),
    }
    points = await measure_rounds(targets, Load("concurrency", 64), ctx.window(), ctx.rounds)
    ctx.procs.stop(procs)
    used = max(1, round(median_of(points["dynamic"], lambda p: p.mean_batch)))
    session = raw_session(dyn, model)
    feeds = {b: stack_rows(pool, b) for b in (1, used)}
    raw: dict[int, list[float]] = {b: [] for b in feeds}
    for _ in range(3):
        for b, f in feeds.items():
            raw[b].append(raw_items_per_s(session, f, b, 1.0 if not ctx.quick else 0.5))
    raw_gain = statistics.median(x / y for x, y in zip(raw[used], raw[1], strict=True))
    plaza_gain = paired_ratio(points["dynamic"], points["mbs1"])
    return {
        "model": model,
        "load": "concurrency 64, Kafka path (SDK -> Kafka -> worker -> Redis)",
        "dynamic": [point_summary(p) for p in points["dynamic"]],
        "max_batch_size_1": [point_summary(p) for p in points["mbs1"]],
        "batch_size_used": used,
        "raw_items_per_s": {str(b): statistics.median(v) for b, v in raw.items()},
        "ratios": {
            "plaza_dynamic_vs_mbs1": plaza_gain,
            f"raw_ort_batch{used}_vs_batch1": raw_gain,
            "plaza_gain_share_of_raw_gain": plaza_gain / raw_gain,
        },
    }


# -- pipeline efficiency ---------------------------------------------------------------------


async def pipeline(ctx: Context) -> Report:
    """MiniLM (pad 32) saturated through Kafka, over raw ORT at the batch size Plaza used."""
    model = "minilm"
    dep = ctx.deployment("pipeline", {model: None})
    pool = text_pool(pad_to=32)
    procs = await start_workers(ctx, dep, model, pool)
    session = raw_session(dep, model)
    target = KafkaTarget(dep.settings(), model, pool, timeout_s=60)
    await target.start()
    points: list[PointResult] = []
    raw: list[float] = []
    try:
        for _ in range(ctx.rounds + 1):
            point = await measure_logged(target, Load("concurrency", 64), ctx.window())
            points.append(point)
            used = max(1, round(point.mean_batch)) if point.mean_batch == point.mean_batch else 1
            feeds = stack_rows(pool, used)
            window = 0.5 if ctx.quick else 1.0
            raw.append(
                statistics.median(raw_items_per_s(session, feeds, used, window) for _ in range(3))
            )
    finally:
        await target.stop()
    ctx.procs.stop(procs)
    ratios = [p.throughput / r for p, r in zip(points, raw, strict=True)]
    return {
        "model": model,
        "inputs": "plaza.text.tokenize, one sentence per request, pad_to=32",
        "load": "concurrency 64, Kafka path",
        "plaza": [point_summary(p) for p in points],
        "raw_items_per_s_at_batch_used": raw,
        "ratios": {
            "plaza_vs_raw_ort_at_batch_used": statistics.median(ratios),
            "plaza_model_busy_fraction": median_of(points, lambda p: p.model_busy),
        },
    }


# -- against a private lane ------------------------------------------------------------------


async def private_lane(ctx: Context) -> Report:
    """A naive one-request-per-inference server vs Plaza's HTTP path, MLP, c = 1, 16, 64."""
    model = "mlp"
    dep = ctx.deployment("lane", {model: None})
    pool = input_pool(spec_of(dep, model))
    procs = await start_workers(ctx, dep, model, pool)
    url, gateway = await start_gateway(ctx, dep)
    port = free_port()
    baseline = ctx.procs.spawn(
        f"{dep.prefix}-baseline",
        [
            "-m",
            "plaza.loadgen.baseline_server",
            "--model",
            model,
            "--repository",
            str(dep.repository),
            "--port",
            str(port),
            "--threads",
            str(os.cpu_count() or 1),
        ],
        dep.env(),
    )
    await wait_http_ready(http_url(port), ctx.procs)
    report: Report = {"model": model, "concurrency": {}, "ratios": {}}
    curves: dict[str, list[tuple[float, float, float]]] = {}
    for c in (1, 16, 64):
        targets: dict[str, Target] = {
            "private lane": HttpTarget(
                http_url(port), model, pool, binary=False, max_connections=c, label="private lane"
            ),
            "plaza http-json": HttpTarget(url, model, pool, binary=False, max_connections=c),
            "plaza http-binary": HttpTarget(url, model, pool, binary=True, max_connections=c),
        }
        points = await measure_rounds(targets, Load("concurrency", c), ctx.window(), 1)
        lane = points["private lane"]
        report["concurrency"][str(c)] = {k: point_summary(v[0]) for k, v in points.items()}
        for k, v in points.items():
            curves.setdefault(k, []).append(
                (v[0].throughput, v[0].latency.p50_ms, v[0].latency.p99_ms)
            )
        for k in ("plaza http-json", "plaza http-binary"):
            tag = k.removeprefix("plaza ")
            report["ratios"][f"c{c}_{tag}_throughput_vs_lane"] = paired_ratio(points[k], lane)
            report["ratios"][f"c{c}_{tag}_p99_vs_lane"] = paired_ratio(
                points[k], lane, lambda p: p.latency.p99_ms
            )
    ctx.procs.stop([baseline, gateway, *procs])
    from plaza.loadgen.plots import latency_vs_throughput

    try:
        png = latency_vs_throughput(
            curves,
            ctx.out_dir / "private_lane.png",
            "MLP: private lane vs Plaza HTTP (c = 1, 16, 64)",
        )
        report["plot"] = str(png)
    except ImportError:
        ctx.notes.append("private_lane: matplotlib missing, no plot")
    return report


# -- latency floor ---------------------------------------------------------------------------


GOAL2_P50_MS, GOAL2_P99_MS = 2.0, 6.0
"""Issue 12's goal 2: at c=1, at most this much beyond the queue delay and a direct call."""


async def latency_floor(ctx: Context) -> Report:
    """Concurrency 1: Plaza's p50 / p99 minus a direct ONNX Runtime call's."""
    model = "mlp"
    dep = ctx.deployment("floor", {model: None})
    dep0 = ctx.deployment("floor-nodelay", {model: no_queue_delay})
    pool = input_pool(spec_of(dep, model))
    procs = [
        *await start_workers(ctx, dep, model, pool),
        *await start_workers(ctx, dep0, model, pool),
    ]
    url, gateway = await start_gateway(ctx, dep)
    await warm_kafka(ctx, dep, model, pool)
    session = raw_session(dep, model)
    direct: list[float] = raw_call_latencies(session, pool[0], 2.0)
    labels = (
        "kafka (config: max_queue_delay 2000 us)",
        "kafka (max_queue_delay 0)",
        "http-binary (config)",
    )
    targets: dict[str, Target] = {
        labels[0]: KafkaTarget(dep.settings(), model, pool, label=labels[0]),
        labels[1]: KafkaTarget(dep0.settings(), model, pool, label=labels[1]),
        labels[2]: HttpTarget(url, model, pool, binary=True, max_connections=1, label=labels[2]),
    }
    delay_ms = {
        label: BatchingPolicy.from_spec(spec_of(d, model)).max_queue_delay_us / 1000
        for label, d in zip(labels, (dep, dep0, dep), strict=True)
    }
    points = await measure_rounds(targets, Load("concurrency", 1), ctx.window(), ctx.rounds)
    direct += raw_call_latencies(session, pool[0], 2.0)
    ctx.procs.stop([gateway, *procs])
    d = summarize(direct)
    paths: Report = {}
    ratios: Report = {}
    for label, pts in points.items():
        p50 = median_of(pts, lambda p: p.latency.p50_ms)
        p99 = median_of(pts, lambda p: p.latency.p99_ms)
        queue = median_of(pts, lambda p: p.server.queue_us if p.server else float("nan"))
        # Goal 2 of issue 12: beyond the model's own queue delay and a direct call.
        beyond50 = p50 - delay_ms[label] - d.p50_ms
        beyond99 = p99 - delay_ms[label] - d.p99_ms
        paths[label] = {
            "p50_ms": p50,
            "p99_ms": p99,
            "p50_minus_direct_ms": p50 - d.p50_ms,
            "p99_minus_direct_ms": p99 - d.p99_ms,
            "max_queue_delay_ms": delay_ms[label],
            "p50_beyond_delay_and_direct_ms": beyond50,
            "p99_beyond_delay_and_direct_ms": beyond99,
            "server_queue_us": queue,
        }
        ratios[f"{label}: p50 vs direct"] = p50 / d.p50_ms
        ratios[f"{label}: p50 ms beyond delay and direct (goal <= {GOAL2_P50_MS:g})"] = beyond50
        ratios[f"{label}: p99 ms beyond delay and direct (goal <= {GOAL2_P99_MS:g})"] = beyond99
    return {
        "model": model,
        "direct_ort_batch1": {"p50_ms": d.p50_ms, "p99_ms": d.p99_ms, "calls": d.count},
        "paths": paths,
        "ratios": ratios,
    }


# -- scale -----------------------------------------------------------------------------------

SCALE_A_US, SCALE_B_US, SCALE_MAX_BATCH = 1000, 40000, 16


async def scale(ctx: Context) -> Report:
    """1, 2, 4 workers of the simulated device (a*n+b sleeping), 4 partitions, c = 128;
    with the simulator's prediction for each."""
    model = "simulated"
    edit = chain(
        set_parameters(latency_a_us=SCALE_A_US, latency_b_us=SCALE_B_US),
        max_batch(SCALE_MAX_BATCH),
    )
    deps = {n: ctx.deployment(f"scale-{n}", {model: edit}, partitions=4) for n in (1, 2, 4)}
    pool = input_pool(spec_of(deps[1], model))
    procs: list[Any] = []
    for n, dep in deps.items():
        procs += await start_workers(ctx, dep, model, pool, count=n)
    targets: dict[str, Target] = {
        str(n): KafkaTarget(dep.settings(), model, pool, label=f"{n} workers")
        for n, dep in deps.items()
    }
    points = await measure_rounds(targets, Load("concurrency", 128), ctx.window(), ctx.rounds)
    ctx.procs.stop(procs)
    spec = spec_of(deps[1], model)
    report: Report = {
        "model": f"{model} (a={SCALE_A_US} us, b={SCALE_B_US} us, "
        f"max_batch_size {SCALE_MAX_BATCH})",
        "workers": {},
        "ratios": {},
    }
    for label, pts in points.items():
        overhead_us = median_of(pts, lambda p: p.client_overhead_us)
        predicted = simulate(
            SimConfig(
                BatchingPolicy.from_spec(spec),
                LinearLatency.from_spec(spec),
                concurrency=128,
                overhead_s=max(0.0, overhead_us) / 1e6,
                instances=int(label),
                partitions=4,
                duration_s=20,
                warmup_s=2,
            )
        )
        real = median_of(pts, lambda p: p.throughput)
        report["workers"][label] = {
            "points": [point_summary(p) for p in pts],
            "simulated_throughput": predicted.throughput,
            "simulated_vs_real": predicted.throughput / real,
        }
        report["ratios"][f"{label}_workers_vs_1"] = paired_ratio(pts, points["1"])
    return report


# -- worker overhead -------------------------------------------------------------------------


async def overhead(ctx: Context) -> Report:
    """The identity model through Kafka at concurrency 64: CPU per request of each process."""
    model = "identity"
    dep = ctx.deployment("overhead", {model: None})
    pool = input_pool(spec_of(dep, model))
    procs = await start_workers(ctx, dep, model, pool)
    svc = ctx.services
    pids = {
        "worker": procs[0].pid,
        "kafka": svc.kafka.pid(0) if svc.kafka else None,
        "redis": svc.redis.pid if svc.redis else None,
        "client (load generator)": None,
    }
    target = KafkaTarget(dep.settings(), model, pool)
    await target.start()
    before = {k: cpu_seconds(pid) for k, pid in pids.items()}
    try:
        point = await measure_logged(target, Load("concurrency", 64), ctx.window())
    finally:
        after = {k: cpu_seconds(pid) for k, pid in pids.items()}
        await target.stop()
    ctx.procs.stop(procs)
    per_request = {k: (after[k] - before[k]) / max(1, point.total_ok) * 1e6 for k in pids}
    batch = max(1, round(point.mean_batch)) if point.mean_batch == point.mean_batch else 1
    session = raw_session(dep, model)
    model_us = 1e6 / raw_items_per_s(session, stack_rows(pool, batch), batch, 1.0)
    return {
        "model": model,
        "point": point_summary(point),
        "cpu_us_per_request": per_request,
        "raw_ort_us_per_item_at_batch_used": model_us,
        "batch_size_used": batch,
        "ratios": {
            "worker_cpu_us_per_request": per_request["worker"],
            "worker_cpu_per_request_vs_model_time": per_request["worker"] / model_us,
            "worker_share_of_all_cpu": per_request["worker"] / sum(per_request.values()),
        },
    }


# -- simulator vs a real run -----------------------------------------------------------------


def capacity(policy: BatchingPolicy, latency: LinearLatency) -> float:
    """Requests/s of one instance running full batches back to back."""
    return policy.max_batch_size / latency.batch_latency_s(policy.max_batch_size)


async def simulator(ctx: Context) -> Report:
    """The committed simulated-device model through a real worker fed by the SDK, against
    the simulator's prediction for the same load (within 15% is the bar)."""
    model = "simulated"
    dep = ctx.deployment("simcheck", {model: None}, partitions=4)
    spec = spec_of(dep, model)
    policy, latency = BatchingPolicy.from_spec(spec), LinearLatency.from_spec(spec)
    cap = capacity(policy, latency)
    pool = input_pool(spec)
    procs = await start_workers(ctx, dep, model, pool)
    cfg = ctx.window(stable_count=3, max_windows=3)
    loads = [
        Load("rate", round(0.6 * cap), "poisson", seed=1),
        Load("rate", round(1.3 * cap), "constant"),
        Load("concurrency", 2 * policy.max_batch_size),
    ]
    target = KafkaTarget(dep.settings(), model, pool, timeout_s=60)
    await target.start()
    rows: list[Report] = []
    try:
        for load in loads:
            real = await measure_logged(target, load, cfg)
            rows.append(compare_with_simulation(real, load, cfg, policy, latency, dep.partitions))
    finally:
        await target.stop()
    ctx.procs.stop(procs)
    return {
        "model": f"{model} ({latency.describe()}, max_batch_size {policy.max_batch_size}, "
        f"max_queue_delay {policy.max_queue_delay_us} us)",
        "capacity_per_s": cap,
        "loads": rows,
        "ratios": {r["load"]: r["simulated_vs_real"] for r in rows},
    }


def compare_with_simulation(
    real: PointResult,
    load: Load,
    cfg: Any,
    policy: BatchingPolicy,
    latency: LinearLatency,
    partitions: int,
) -> Report:
    """The simulator on the same load as ``real`` (open loop: the same arrival times;
    closed loop: the real run's measured overhead outside the worker)."""
    duration = cfg.warmup_s + len(real.windows) * cfg.window_s
    common: dict[str, Any] = dict(
        policy=policy,
        latency=latency,
        partitions=partitions,
        duration_s=duration,
        warmup_s=duration - min(cfg.stable_count, len(real.windows)) * cfg.window_s,
    )
    if load.mode == "rate":
        arrivals = ArrivalProcess(load.value, load.distribution, seed=load.seed)
        sim = simulate(SimConfig(arrivals=arrivals, **common))
        note = "same arrival process and seed"
    else:
        overhead_s = max(0.0, real.client_overhead_us) / 1e6
        sim = simulate(SimConfig(concurrency=int(load.value), overhead_s=overhead_s, **common))
        note = f"overhead outside the worker taken from the run: {overhead_s * 1e3:.2f} ms"
    return {
        "load": load.label,
        "real": point_summary(real),
        "simulated": {
            "throughput": sim.throughput,
            "p50_ms": sim.latency.p50_ms,
            "p99_ms": sim.latency.p99_ms,
            "mean_batch": sim.mean_batch,
        },
        "simulated_vs_real": sim.throughput / real.throughput if real.throughput else float("nan"),
        "note": note,
    }


from plaza.loadgen.bench.perf import (  # noqa: E402
    ort_spinning,
    ort_threads,
    perf_analyzer_lanes,
    queue_delay_from,
)

BENCHMARKS: dict[str, Benchmark] = {
    "batching": batching,
    "pipeline": pipeline,
    "private_lane": private_lane,
    "latency_floor": latency_floor,
    "scale": scale,
    "overhead": overhead,
    "simulator": simulator,
    "ort_spinning": ort_spinning,
    "ort_threads": ort_threads,
    "queue_delay_from": queue_delay_from,
    "perf_analyzer": perf_analyzer_lanes,
    "text_embed": text_embed,
    "streaming": streaming,
    "ensemble_streaming": ensemble_streaming,
}
