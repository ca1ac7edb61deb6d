"""Model hosts, measured side by side: ``python -m plaza.loadgen.bench.hosts [--quick]``.

- **fairness**: two copies of the simulated device (``quiet``, ``flood``) in one host whose
  device runs one execution at a time (``host.execution_slots`` 1). The quiet model's p99
  at a low request rate is measured alone and with the flood model driven by many clients
  (from a process of their own), in interleaved rounds, for flood requests of 4 rows and of
  1 row; the ratios (goal: within 2x) and the flood's mean batch are printed.
- **memory**: the sample repository served by one host process vs one worker process per
  model, each warmed with requests: the RSS sum (and the PSS sum, which counts shared pages
  once) after loading.
- **scale**: throughput of 1, 2 and 4 hosts of one simulated model on a 4-partition topic
  (one consumer group), under the same closed-loop load: the device, not the 2 CPUs, bounds
  each host, so the figure shows what more consumer-group members add (up to the partition
  count: a fifth host would own no partition).

It starts its own Kafka and Redis (free loopback ports, under ``--work-dir``) like the suite,
prints the ratios and writes ``results/bench/hosts.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import shutil
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plaza.loadgen import report_json
from plaza.loadgen.bench.context import (
    Context,
    measure_logged,
    median_of,
    paired_ratio,
    point_summary,
    spec_of,
)
from plaza.loadgen.inputs import input_pool
from plaza.loadgen.measure import Load, PointResult
from plaza.loadgen.stack import chain, fresh_dir, set_parameters, warm_up
from plaza.loadgen.sweep import environment
from plaza.loadgen.targets import KafkaTarget, StatsSnapshot
from plaza.repository import ModelRepository
from plaza.stack import (
    Deployment,
    HostProcess,
    ProcessGroup,
    Services,
    WorkerProcess,
    wait_assignment,
)

Report = dict[str, Any]
QUIET_RATE = 20.0
"""Requests/s of the quiet model (a low, steady rate)."""
FLOOD_CLIENTS = 64
FLOOD_ROWS = (4, 1)
"""Rows per flood request: 4 (a batch of 16 rows is 4 requests, about 330 requests/s: the
device is the bottleneck) and 1 (1,300 requests/s: the host's CPU work per request too)."""
DEVICE = {"latency_a_us": 250, "latency_b_us": 8000}
"""Both models' simulated device: 8 ms a batch plus 0.25 ms a row (batch 16: 12 ms), so the
flood is bound by the device at about 1,300 requests/s and the 2 CPUs do not decide it."""


def _sixteen(config: Any) -> None:
    config.max_batch_size = 16
    config.dynamic_batching.max_queue_delay_microseconds = 1000


async def fairness(ctx: Context) -> Report:
    """The quiet model's p99 alone vs next to a flooded neighbour, on one host."""
    edit = chain(set_parameters(**DEVICE), _sixteen)
    dep = ctx.deployment("hosts-fair", {}, partitions=4)
    for model in ("quiet", "flood"):  # copies of the simulated model under these names
        _rename_copy(ctx, dep.repository, model, edit)
    env = {"PLAZA_HOST__EXECUTION_SLOTS": "1", "PLAZA_WORKER__DEVICE": "cpu"}
    host = ctx.procs.start(HostProcess(dep, ["quiet", "flood"], ctx.procs.log_dir, env=env))
    await host.wait_registered()
    pools = {m: input_pool(spec_of(dep, m)) for m in ("quiet", "flood")}
    for model, pool in pools.items():
        await warm_up(dep, model, pool)
    quiet = KafkaTarget(dep.settings(), "quiet", pools["quiet"], label="quiet")
    flood = KafkaTarget(dep.settings(), "flood", pools["flood"], label="flood")
    load = Load("rate", QUIET_RATE, "poisson")
    cfg = ctx.window(stable_count=99)  # every window: the same length alone and flooded
    alone: list[PointResult] = []
    flooded: dict[int, list[PointResult]] = {rows: [] for rows in FLOOD_ROWS}
    batches: dict[int, list[float]] = {rows: [] for rows in FLOOD_ROWS}
    await quiet.start()
    await flood.start()
    try:
        for _ in range(ctx.rounds):
            alone.append(await measure_logged(quiet, load, cfg))
            for rows in FLOOD_ROWS:
                point, mean_batch = await _with_flood(dep, quiet, flood, load, cfg, rows)
                flooded[rows].append(point)
                batches[rows].append(mean_batch)
    finally:
        await quiet.stop()
        await flood.stop()
        ctx.procs.stop([host])
    p99 = lambda p: p.latency.p99_ms  # noqa: E731
    ratios: dict[str, Any] = {"quiet_p99_alone_ms": median_of(alone, p99)}
    for rows in FLOOD_ROWS:
        ratio = paired_ratio(flooded[rows], alone, p99)
        ratios[f"quiet_p99_flooded_vs_alone_flood_rows_{rows}"] = ratio
        ratios[f"quiet_p99_flooded_ms_flood_rows_{rows}"] = median_of(flooded[rows], p99)
        ratios[f"flood_mean_batch_rows_flood_rows_{rows}"] = statistics.median(batches[rows])
    return {
        "command": "python -m plaza.loadgen.bench.hosts --only fairness",
        "device": DEVICE,
        "execution_slots": 1,
        "quiet_rate": QUIET_RATE,
        "flood_clients": FLOOD_CLIENTS,
        "flood_rows": list(FLOOD_ROWS),
        "alone": [point_summary(p) for p in alone],
        "flooded": {str(r): [point_summary(p) for p in ps] for r, ps in flooded.items()},
        "flood_mean_batch_rows": {str(r): b for r, b in batches.items()},
        "ratios": ratios,
    }


def _rename_copy(ctx: Context, repo: Path, model: str, edit: Any) -> None:
    from plaza.loadgen.stack import copy_model

    shutil.rmtree(repo / model, ignore_errors=True)
    dst = copy_model(ctx.repository, repo, "simulated", edit)
    text = (dst / "config.pbtxt").read_text().replace('name: "simulated"', f'name: "{model}"')
    (dst / "config.pbtxt").write_text(text)
    dst.rename(repo / model)


async def _with_flood(
    dep: Deployment, quiet: KafkaTarget, flood: KafkaTarget, load: Load, cfg: Any, rows: int
) -> tuple[PointResult, float]:
    """Measure the quiet model while FLOOD_CLIENTS clients keep the flood model busy with
    requests of ``rows`` rows.

    The flood's clients run in a process of their own: on this event loop they would delay
    the quiet model's client, which is not what is measured.
    """
    spawn = multiprocessing.get_context("spawn")
    stop = spawn.Event()
    pool = input_pool(spec_of(dep, "flood"), rows=rows)
    before = await flood.stats()
    driver = spawn.Process(target=_flood_main, args=(dep, pool, FLOOD_CLIENTS, stop))
    driver.start()
    try:
        await asyncio.sleep(2 * cfg.warmup_s + 1.0)  # the process starts, the queue builds up
        point = await measure_logged(quiet, load, cfg)
    finally:
        stop.set()
        await asyncio.to_thread(driver.join, 30)
        if driver.is_alive():
            driver.kill()
    return point, _mean_batch(before, await flood.stats())


def _flood_main(dep: Deployment, pool: list[Any], clients: int, stop: Any) -> None:
    """The flood process: ``clients`` closed-loop clients of the flood model until ``stop``."""

    async def flood() -> None:
        target = KafkaTarget(dep.settings(), "flood", pool, label="flood")
        await target.start()

        async def client() -> None:
            while not stop.is_set():
                await target.send()

        try:
            await asyncio.gather(*(client() for _ in range(clients)))
        finally:
            await target.stop()

    asyncio.run(flood())


def _mean_batch(before: StatsSnapshot | None, after: StatsSnapshot | None) -> float:
    if after is None:
        return float("nan")
    old = before.batches if before is not None else {}
    runs = {s: n - old.get(s, 0) for s, n in after.batches.items()}
    count = sum(runs.values())
    return sum(s * n for s, n in runs.items()) / count if count else float("nan")


# -- memory ------------------------------------------------------------------------------------


def _kib(pid: int | None, path: str, field: str) -> int:
    if pid is None:
        return 0
    for line in Path(f"/proc/{pid}/{path}").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


def _sample_models(ctx: Context) -> list[str]:
    import importlib.util

    repo = ModelRepository(ctx.repository)
    torch_ok = importlib.util.find_spec("torch") is not None
    return [
        m for m in repo.model_names() if torch_ok or repo.spec(m).platform != "pytorch_libtorch"
    ]


async def memory(ctx: Context) -> Report:
    """RSS and PSS of the sample repository: one host vs one process per model."""
    models = _sample_models(ctx)
    layouts: dict[str, dict[str, Any]] = {}
    env = {"PLAZA_WORKER__DEVICE": "cpu"}
    for layout in ("one_host", "process_per_model"):
        dep = ctx.deployment(f"hosts-mem-{layout}", dict.fromkeys(models))
        log_dir = ctx.procs.log_dir
        procs: list[HostProcess] = (
            [HostProcess(dep, models, log_dir, env=env)]
            if layout == "one_host"
            else [WorkerProcess(dep, m, log_dir, env=env) for m in models]
        )
        for proc in procs:
            ctx.procs.start(proc)
        try:
            for proc in procs:
                await proc.wait_registered()
            for model in models:
                await warm_up(dep, model, input_pool(spec_of(dep, model)))
            rss = sum(_kib(p.pid, "status", "VmRSS") for p in procs)
            pss = sum(_kib(p.pid, "smaps_rollup", "Pss") for p in procs)
            layouts[layout] = {
                "processes": len(procs),
                "rss_mib": rss / 1024,
                "pss_mib": pss / 1024,
            }
            print(
                f"   {layout}: {len(procs)} processes, RSS {rss / 1024:.0f} MiB, "
                f"PSS {pss / 1024:.0f} MiB",
                flush=True,
            )
        finally:
            ctx.procs.stop(procs)
    host, per_model = layouts["one_host"], layouts["process_per_model"]
    return {
        "command": "python -m plaza.loadgen.bench.hosts --only memory",
        "models": models,
        "layouts": layouts,
        "ratios": {
            "rss_one_host_vs_per_model": host["rss_mib"] / per_model["rss_mib"],
            "pss_one_host_vs_per_model": host["pss_mib"] / per_model["pss_mib"],
            "rss_one_host_mib": host["rss_mib"],
            "rss_per_model_mib": per_model["rss_mib"],
        },
    }


# -- scale -------------------------------------------------------------------------------------

SCALE_HOSTS = (1, 2, 4)
SCALE_PARTITIONS = 4
SCALE_CLIENTS = 256
SCALE_DEVICE = {"latency_a_us": 0, "latency_b_us": 20000}
"""20 ms a batch of up to 16 rows, one execution at a time: at most 800 rows/s a host."""


async def scale(ctx: Context) -> Report:
    """Throughput of 1, 2, 4 hosts of one model (one consumer group, 4 partitions)."""
    edit = chain(set_parameters(**SCALE_DEVICE), _sixteen)
    dep = ctx.deployment("hosts-scale", {"simulated": edit}, partitions=SCALE_PARTITIONS)
    pool = input_pool(spec_of(dep, "simulated"))
    # INFO: wait_assignment reads each process's partitions from its log.
    env = {"PLAZA_WORKER__DEVICE": "cpu", "PLAZA_LOG_LEVEL": "INFO"}
    target = KafkaTarget(dep.settings(), "simulated", pool, label="simulated")
    load = Load("concurrency", SCALE_CLIENTS)
    cfg = ctx.window()
    hosts: list[WorkerProcess] = []
    points: dict[int, list[PointResult]] = {}
    await target.start()
    try:
        for count in SCALE_HOSTS:
            while len(hosts) < count:
                name = f"scale-{len(hosts)}"
                proc = WorkerProcess(
                    dep, "simulated", ctx.procs.log_dir, name=name, worker_id=name, env=env
                )
                hosts.append(ctx.procs.start(proc))
            for host in hosts:
                await host.wait_registered()
            await wait_assignment(hosts, SCALE_PARTITIONS)
            await warm_up(dep, "simulated", pool)
            points[count] = [await measure_logged(target, load, cfg) for _ in range(ctx.rounds)]
    finally:
        await target.stop()
        ctx.procs.stop(hosts)
    throughput = {n: statistics.median(p.throughput for p in ps) for n, ps in points.items()}
    ratios: dict[str, Any] = {f"infer_per_s_{n}_hosts": t for n, t in throughput.items()}
    for n in SCALE_HOSTS[1:]:
        ratios[f"throughput_{n}_hosts_vs_1"] = throughput[n] / throughput[SCALE_HOSTS[0]]
    return {
        "command": "python -m plaza.loadgen.bench.hosts --only scale",
        "device": SCALE_DEVICE,
        "partitions": SCALE_PARTITIONS,
        "clients": SCALE_CLIENTS,
        "points": {str(n): [point_summary(p) for p in ps] for n, ps in points.items()},
        "ratios": ratios,
    }


BENCHMARKS = {"fairness": fairness, "memory": memory, "scale": scale}


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m plaza.loadgen.bench.hosts", description=__doc__)
    p.add_argument("--only", help=f"comma-separated subset of: {', '.join(BENCHMARKS)}")
    p.add_argument("--quick", action="store_true", help="shorter windows, one round")
    p.add_argument("--repository", type=Path, default=Path("model_repository"))
    p.add_argument("--out-dir", type=Path, default=Path("results/bench"))
    p.add_argument("--work-dir", type=Path, default=Path("var/bench-hosts"))
    return p.parse_args(argv)


async def _run(ctx: Context, names: list[str]) -> Report:
    report: Report = {"environment": environment(), "quick": ctx.quick}
    for name in names:
        started = time.monotonic()
        print(f"-- {name} ...", flush=True)
        result = await BENCHMARKS[name](ctx)
        result["seconds"] = round(time.monotonic() - started, 1)
        report[name] = result
        print(f"== {name}")
        for key, value in result["ratios"].items():
            print(f"   {key}: {value:.3f}" if isinstance(value, float) else f"   {key}: {value}")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    names = [n.strip() for n in (args.only or ",".join(BENCHMARKS)).split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise SystemExit(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    work = fresh_dir(args.work_dir)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    services = Services(work / "services", fast_start=False)
    procs = ProcessGroup(work / "logs")
    ctx = Context(args.repository, work, args.out_dir, services, procs, args.quick)
    try:
        with services:
            report = asyncio.run(_run(ctx, names))
    finally:
        procs.stop_all()
    path = args.out_dir / "hosts.json"
    path.write_text(report_json.dumps(report) + "\n", encoding="utf-8")
    print(f"wrote {path}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
