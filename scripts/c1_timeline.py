"""Where a request's time goes at concurrency 1: the Kafka path and HTTP, side by side.

    python scripts/c1_timeline.py --model mlp -n 400 [--rounds 2] [--delay-us 0]

Runs on a Kafka and Redis that already run (``PLAZA_KAFKA__BOOTSTRAP_SERVERS``,
``PLAZA_REDIS__URL``; ``plaza services up``), under a fresh prefix: one worker of MODEL and
one gateway (ports 18120-18122). Then, in alternating rounds, ``n`` requests one after the
other through the SDK (``kafka``) and through the gateway (``http-binary``). For each
request the worker's ``timing_us`` splits the client's latency into the batcher's queue
(received -> execution start), compute (input, infer, output) and the rest: the hops
between the processes (the produce, the fetch, the result's write and its wake-up) and
the client's and gateway's own work. Prints the medians and p99s of each part.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from plaza.loadgen.inputs import input_pool
from plaza.loadgen.stack import ConfigEdit, copy_model
from plaza.loadgen.targets import HttpTarget, KafkaTarget, Target
from plaza.model_control import model_spec
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings


def queue_delay(us: int) -> ConfigEdit:
    def edit(config: mc.ModelConfig) -> None:
        config.dynamic_batching.max_queue_delay_microseconds = us

    return edit


PORTS = (18120, 18121, 18122)
COMPUTE = ("compute_input", "compute_infer", "compute_output")
PARTS = ("total", "queue", *COMPUTE, "rest")


def _start(
    args: argparse.Namespace, env: dict[str, str], log_dir: Path
) -> list[subprocess.Popen[bytes]]:
    py = sys.executable
    procs = []
    for role, extra in (("worker", ["--worker.model", args.model]), ("gateway", [])):
        log = open(log_dir / f"{role}.log", "wb")  # noqa: SIM115 (open for the child's life)
        procs.append(
            subprocess.Popen(
                [py, "-m", "plaza.cli.main", role, *extra], env=env, stdout=log, stderr=log
            )
        )
    return procs


async def _round(target: Target, n: int) -> dict[str, list[float]]:
    parts: dict[str, list[float]] = {p: [] for p in PARTS}
    for _ in range(n):
        t0 = time.perf_counter()
        out = await target.send()
        total = (time.perf_counter() - t0) * 1e6
        if not out.ok:
            raise SystemExit(f"{getattr(target, 'label', '?')}: {out.error}")
        timing = out.timing_us
        parts["total"].append(total)
        if timing:
            for p in ("queue", *COMPUTE):
                parts[p].append(float(timing.get(p, 0)))
            parts["rest"].append(total - sum(float(timing.get(p, 0)) for p in ("queue", *COMPUTE)))
    return parts


def _line(label: str, parts: dict[str, list[float]]) -> str:
    cells = []
    for p in PARTS:
        v = parts[p]
        if v:
            cells.append(f"{p} {np.percentile(v, 50) / 1000:.2f}/{np.percentile(v, 99) / 1000:.2f}")
    return f"{label:12s} p50/p99 ms: " + ", ".join(cells)


async def _main(args: argparse.Namespace) -> None:
    prefix = f"tl{os.getpid()}"
    env = {
        **os.environ,
        "PLAZA_KAFKA__TOPIC_PREFIX": f"{prefix}.",
        "PLAZA_REDIS__KEY_PREFIX": f"{prefix}:",
        "PLAZA_LOG_LEVEL": "WARNING",
        "PLAZA_WORKER__METRICS_PORT": "-1",
        "PLAZA_GATEWAY__HTTP_PORT": str(PORTS[0]),
        "PLAZA_GATEWAY__GRPC_PORT": str(PORTS[1]),
        "PLAZA_GATEWAY__METRICS_PORT": str(PORTS[2]),
        "PLAZA_GATEWAY__MODELS": args.model,
    }
    if args.delay_us is not None:  # a copy of the model with that delay
        repo = Path(tempfile.mkdtemp(prefix="plaza-timeline-"))
        copy_model(PlazaSettings().repository, repo, args.model, queue_delay(args.delay_us))
        env["PLAZA_REPOSITORY"] = str(repo)
    os.environ.update(env)
    settings = PlazaSettings()
    spec = model_spec(ModelRepository(settings.repository), args.model, None)
    pool = input_pool(spec)
    log_dir = Path("var/profile") / f"timeline-{args.model}"
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = _start(args, env, log_dir)
    try:
        await asyncio.sleep(12)
        url = f"http://127.0.0.1:{PORTS[0]}"
        targets: list[Target] = [
            KafkaTarget(settings, args.model, pool, label="kafka"),
            HttpTarget(url, args.model, pool, binary=True, max_connections=1),
        ]
        for t in targets:
            await t.start()
            await _round(t, 50)  # connections, caches
        delay = spec.batching.max_queue_delay_us
        print(f"{args.model}: max_queue_delay {delay} us, {args.n} requests per round")
        for r in range(args.rounds):
            for t in targets:
                label = str(getattr(t, "label", "?"))
                print(f"round {r + 1} " + _line(label, await _round(t, args.n)), flush=True)
        for t in targets:
            await t.stop()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="mlp")
    ap.add_argument("-n", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--delay-us",
        type=int,
        help="the model's max_queue_delay_microseconds (default: its config)",
    )
    asyncio.run(_main(ap.parse_args()))


if __name__ == "__main__":
    main()
