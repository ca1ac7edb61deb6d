"""``make bench``'s ``streaming`` case: a decoupled model's responses through a worker.

A decoupled model (``model_transaction_policy { decoupled: true }``) answers a request many
times. The model here, ``tokens``, sends ``COUNT`` responses of one INT32 each, as fast as
it can, then closes the request: its own cost is small, so what is measured is Plaza's
per-response path (the model process's frame, the runner, the hand-over to the writer,
the Redis write, the reader of the result stream). A producer publishes ``REQUESTS``
requests to Kafka with a result stream and reads every response from it.

Side by side, in alternating rounds (a fresh worker each time): the worker as it is
(``worker.max_waiting_responses`` at its default: the writer takes every response waiting
in one Redis call) against ``worker.max_waiting_responses=1`` (one call per response, as
the first build of decoupled models wrote them). Reported: responses per second, and the
worker's CPU per response (its process and its model's process).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from plaza.client import PlazaClient, make_request
from plaza.contract import InferRequest
from plaza.loadgen.bench.context import Context, tree_cpu_seconds
from plaza.stack import Deployment, WorkerProcess, new_prefix, wait_workers

MODEL = "tokens"
REQUESTS, COUNT = 64, 200
"""Requests per round, and the responses each asks for."""
CONFIG = """
name: "tokens"
backend: "python"
max_batch_size: 16
input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "TOKEN" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
dynamic_batching { max_queue_delay_microseconds: 2000 }
"""
MODEL_PY = '''
import numpy as np

import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    """COUNT responses per request, TOKEN = 0, 1, ...; the last one closes the request."""

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0, 0])
            for i in range(count):
                token = pb_utils.Tensor("TOKEN", np.array([[i]], np.int32))
                flags = FINAL if i == count - 1 else 0
                sender.send(pb_utils.InferenceResponse(output_tensors=[token]), flags=flags)
        return None
'''
READ_BASE_S, READ_PER_REQUEST_S = 60.0, 1.0
"""How long ``publish_and_read`` waits for every final response: generous, but bounded."""
VARIANTS = {"a Redis call per response": "1", "responses gathered (default)": ""}
Report = dict[str, Any]


def _deployment(ctx: Context) -> Deployment:
    prefix = new_prefix("streaming")
    repo = ctx.work / prefix / "repository"
    (repo / MODEL / "1").mkdir(parents=True)
    (repo / MODEL / "config.pbtxt").write_text(CONFIG.lstrip())
    (repo / MODEL / "1" / "model.py").write_text(MODEL_PY.lstrip())
    return ctx.services.deployment(repo, prefix, partitions=4, log_level="WARNING")


async def _round(ctx: Context, dep: Deployment, limit: str, n: int) -> dict[str, float]:
    """One worker with ``limit`` (\"\": the default); the responses of REQUESTS requests."""
    env = {"PLAZA_WORKER__MAX_WAITING_RESPONSES": limit} if limit else {}
    name = f"{dep.prefix}-worker-{n}"
    worker = ctx.procs.start(WorkerProcess(dep, MODEL, ctx.procs.log_dir, name=name, env=env))
    await wait_workers(dep, MODEL, 1, ctx.procs)
    try:
        async with PlazaClient(dep.settings()) as client:
            stream = client.results_stream(f"round-{n}")
            count = np.array([[COUNT]], np.int32)
            requests = [
                make_request(MODEL, {"COUNT": count}, reply_stream=stream) for _ in range(REQUESTS)
            ]
            cpu_before, started = tree_cpu_seconds(worker.pid), time.perf_counter()
            responses = await publish_and_read(client, stream, requests)
            elapsed = time.perf_counter() - started
            cpu = tree_cpu_seconds(worker.pid) - cpu_before
    finally:
        ctx.procs.stop([worker])
    return {
        "responses_per_s": responses / elapsed,
        "worker_cpu_us_per_response": cpu / responses * 1e6,
        "responses": responses,
    }


@dataclass(slots=True)
class _Tally:
    responses: int = 0
    finals: set[str] = field(default_factory=set)
    """Ids of the requests whose final response came."""


async def publish_and_read(
    client: PlazaClient,
    stream: str,
    requests: Sequence[InferRequest],
    timeout_s: float | None = None,
) -> int:
    """Publish ``requests`` (their replies to ``stream``) and read ``stream`` until each
    one's final response came; how many responses came. RuntimeError on an error one, and
    when not every final response came within ``timeout_s`` (default ``READ_BASE_S`` +
    ``READ_PER_REQUEST_S`` a request): a lost response must not hang the bench."""
    limit = READ_BASE_S + READ_PER_REQUEST_S * len(requests) if timeout_s is None else timeout_s
    tally = _Tally()
    try:
        async with asyncio.timeout(limit):
            await client.publish_many(requests)
            return await _read_finals(client, stream, len(requests), tally)
    except TimeoutError:
        missing = [r.id for r in requests if r.id not in tally.finals]
        raise RuntimeError(
            f"{stream}: no final response after {limit:g} s for {len(missing)} of "
            f"{len(requests)} request(s) (first ids: {', '.join(missing[:3])}); "
            f"{tally.responses} response(s) read"
        ) from None


async def _read_finals(client: PlazaClient, stream: str, expected: int, tally: _Tally) -> int:
    async for _, results in client.consume(stream, "bench", "c", block_ms=500, count=512):
        for result in results:
            if result.error is not None:
                raise RuntimeError(f"{result.model}: {result.error.message}")
            tally.responses += 1
            if result.final:
                tally.finals.add(result.id)
        if len(tally.finals) >= expected:
            return tally.responses
    raise RuntimeError(f"{stream}: the result stream ended")  # consume does not end


async def streaming(ctx: Context) -> Report:
    """Decoupled ``tokens`` through a worker: the writer's batched Redis calls against one
    call per response (responses/s, CPU per response)."""
    dep = _deployment(ctx)
    rounds: dict[str, list[dict[str, float]]] = {label: [] for label in VARIANTS}
    n = 0
    for _ in range(ctx.rounds + 1):
        for label, limit in VARIANTS.items():
            rounds[label].append(await _round(ctx, dep, limit, n))
            n += 1
    for runs in rounds.values():
        del runs[0]  # the first round warms the broker and the page cache: not counted
    one, gathered = (rounds[label] for label in VARIANTS)
    pairs = list(zip(one, gathered, strict=True))
    speedups = [g["responses_per_s"] / o["responses_per_s"] for o, g in pairs]
    cpu = [g["worker_cpu_us_per_response"] / o["worker_cpu_us_per_response"] for o, g in pairs]
    return {
        "model": MODEL,
        "requests": REQUESTS,
        "responses_per_request": COUNT,
        "rounds": rounds,
        "ratios": {
            "responses_per_s_gathered_vs_one_call_each": statistics.median(speedups),
            "worker_cpu_per_response_gathered_vs_one_call_each": statistics.median(cpu),
            "responses_per_s_gathered": statistics.median(r["responses_per_s"] for r in gathered),
            "worker_cpu_us_per_response_gathered": statistics.median(
                r["worker_cpu_us_per_response"] for r in gathered
            ),
        },
    }
