"""``make bench``'s ``ensemble_streaming`` case: a decoupled step's responses through an
ensemble, against the decoupled model alone.

The decoupled model is the ``streaming`` case's ``tokens`` (``COUNT`` responses of one INT32
each, as fast as it can). The ensemble ``tokens_post`` is decoupled too: ``tokens``, then
``post`` (a simulated copy of each token, no compute): each response of ``tokens`` runs
``post`` once, as a step request through Kafka and Redis, and becomes one response of the
ensemble (docs/models.md, "A decoupled step"). A producer publishes ``REQUESTS`` requests
with a result stream and reads every response from it.

Side by side, in alternating rounds (fresh processes each time): ``tokens`` alone, and the
ensemble (its runner, ``tokens`` and ``post``). Reported: responses per second, and the
CPU per response of the serving processes (their trees: a Python model's process too).
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from plaza.client import PlazaClient, make_request
from plaza.loadgen.bench.context import Context, tree_cpu_seconds
from plaza.loadgen.bench.streaming import CONFIG, MODEL, MODEL_PY, publish_and_read
from plaza.stack import Deployment, WorkerProcess, new_prefix, wait_workers

ENSEMBLE = "tokens_post"
REQUESTS, COUNT = 32, 50
"""Requests per round, and the responses each asks for."""
POST = """
name: "post"
backend: "plaza_simulated"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 1000 }
"""
TOKENS_POST = """
name: "tokens_post"
platform: "ensemble"
max_batch_size: 16
input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "TOKEN" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
ensemble_scheduling {
  step [
    {
      model_name: "tokens"
      model_version: -1
      input_map { key: "COUNT" value: "COUNT" }
      output_map { key: "TOKEN" value: "raw" }
    },
    {
      model_name: "post"
      model_version: -1
      input_map { key: "INPUT0" value: "raw" }
      output_map { key: "OUTPUT0" value: "TOKEN" }
    }
  ]
}
"""
VARIANTS = {
    "tokens alone": (MODEL, (MODEL,)),
    "through the ensemble": (ENSEMBLE, (MODEL, "post", ENSEMBLE)),
}
"""Each variant: the model requests go to, and the models served (a process each)."""
Report = dict[str, Any]


def _deployment(ctx: Context) -> Deployment:
    prefix = new_prefix("ensemble-streaming")
    repo = ctx.work / prefix / "repository"
    for name, config in ((MODEL, CONFIG), ("post", POST), (ENSEMBLE, TOKENS_POST)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config.lstrip())
    (repo / MODEL / "1" / "model.py").write_text(MODEL_PY.lstrip())
    return ctx.services.deployment(repo, prefix, partitions=4, log_level="WARNING")


async def _round(
    ctx: Context, dep: Deployment, target: str, serving: tuple[str, ...], n: int
) -> dict[str, float]:
    """Processes for ``serving``; the responses of REQUESTS requests to ``target``."""
    procs = [
        ctx.procs.start(WorkerProcess(dep, m, ctx.procs.log_dir, name=f"{dep.prefix}-{m}-{n}"))
        for m in serving
    ]
    for model in serving:
        await wait_workers(dep, model, 1, ctx.procs)
    try:
        async with PlazaClient(dep.settings()) as client:
            stream = client.results_stream(f"round-{n}")
            count = np.array([[COUNT]], np.int32)
            requests = [
                make_request(target, {"COUNT": count}, reply_stream=stream) for _ in range(REQUESTS)
            ]
            cpu_before = sum(tree_cpu_seconds(p.pid) for p in procs)
            started = time.perf_counter()
            responses = await publish_and_read(client, stream, requests)
            elapsed = time.perf_counter() - started
            cpu = sum(tree_cpu_seconds(p.pid) for p in procs) - cpu_before
    finally:
        ctx.procs.stop(procs)
    return {
        "responses_per_s": responses / elapsed,
        "cpu_us_per_response": cpu / responses * 1e6,
        "responses": responses,
    }


async def ensemble_streaming(ctx: Context) -> Report:
    """The decoupled ensemble ``tokens_post`` against ``tokens`` alone (responses/s, CPU
    per response of the serving processes)."""
    dep = _deployment(ctx)
    rounds: dict[str, list[dict[str, float]]] = {label: [] for label in VARIANTS}
    n = 0
    for _ in range(ctx.rounds + 1):
        for label, (target, serving) in VARIANTS.items():
            rounds[label].append(await _round(ctx, dep, target, serving, n))
            n += 1
    for runs in rounds.values():
        del runs[0]  # the first round warms the broker and the page cache: not counted
    alone, ensemble = (rounds[label] for label in VARIANTS)
    pairs = list(zip(alone, ensemble, strict=True))
    return {
        "model": MODEL,
        "ensemble": ENSEMBLE,
        "requests": REQUESTS,
        "responses_per_request": COUNT,
        "rounds": rounds,
        "ratios": {
            "responses_per_s_ensemble_vs_alone": statistics.median(
                e["responses_per_s"] / a["responses_per_s"] for a, e in pairs
            ),
            "cpu_per_response_ensemble_vs_alone": statistics.median(
                e["cpu_us_per_response"] / a["cpu_us_per_response"] for a, e in pairs
            ),
        },
    }
