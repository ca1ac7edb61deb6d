"""``make bench``'s ``text_embed`` case: the sample pipeline through Plaza against its three
stages run in one process, one request at a time, with no batching.

Plaza side: the ``text_embed`` ensemble (tokenizer model.py -> ONNX encoder -> pooling
model.py), one worker process per step and an ensemble runner, fed through Kafka by the SDK
at concurrency 64, one sentence per request. Each step batches on its own queue depth; the
report gives each step's mean batch (rows per execution, from the workers' statistics).

In-process side: the same two model.py files (loaded with Plaza's ``pb_utils`` under
Triton's name) and the same encoder file in a bare ONNX Runtime session with a worker's
thread options, called back to back for one sentence at a time: what a small service that
embeds each request as it arrives would do. The two sides run in alternating rounds in
the same run, and the ratio is the median of the rounds' paired ratios.
"""

from __future__ import annotations

import importlib.util
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from plaza.loadgen.bench.context import Context, measure_logged, point_summary
from plaza.loadgen.inputs import InputSet, sentences
from plaza.loadgen.measure import Load, PointResult
from plaza.loadgen.raw_backend import open_session
from plaza.loadgen.targets import KafkaTarget, StatsSnapshot, batches_between
from plaza.modelconfig import load_model_config
from plaza.repository import CONFIG_FILENAME
from plaza.stack import Deployment, WorkerProcess, wait_workers

ENSEMBLE = "text_embed"
TOKENIZER, ENCODER, POOL = "text_embed_tokenizer", "text_embed_encoder", "text_embed_pool"
STEPS = (TOKENIZER, ENCODER, POOL)
CONCURRENCY = 64
Report = dict[str, Any]


def text_inputs(count: int = 64, seed: int = 0) -> list[InputSet]:
    """One sentence per request, as the ensemble's TEXT (BYTES [1, 1])."""
    return [{"TEXT": np.array([[s.encode()]], dtype=np.object_)} for s in sentences(count, seed)]


def load_model_py(path: Path) -> ModuleType:
    """A model.py imported in this process, ``triton_python_backend_utils`` being Plaza's."""
    from plaza.workers.backends import pb_utils

    sys.modules.setdefault("triton_python_backend_utils", pb_utils)
    spec = importlib.util.spec_from_file_location(f"bench_{path.parent.parent.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class InProcessPipeline:
    """tokenizer -> encoder -> pool for one request at a time, in this process."""

    def __init__(self, repository: Path, threads: int) -> None:
        from google.protobuf import json_format

        from plaza.workers.backends import pb_utils

        self.pb = pb_utils
        config = load_model_config(repository / TOKENIZER / CONFIG_FILENAME).config
        args = {
            "model_config": json.dumps(
                json_format.MessageToDict(config, preserving_proto_field_name=True)
            ),
            "model_repository": str(repository / TOKENIZER),
            "model_version": "1",
        }
        self.tokenizer = load_model_py(
            repository / TOKENIZER / "1" / "model.py"
        ).TritonPythonModel()
        self.tokenizer.initialize(args)
        self.pool = load_model_py(repository / POOL / "1" / "model.py").TritonPythonModel()
        self.encoder = open_session(repository / ENCODER / "1" / "model.onnx", threads)

    def _step(self, model: Any, inputs: InputSet) -> dict[str, Any]:
        request = self.pb.InferenceRequest(
            model_name="in-process",
            requested_output_names=[],
            inputs=[self.pb.Tensor(k, v) for k, v in inputs.items()],
        )
        (response,) = model.execute([request])
        if response.has_error():
            raise RuntimeError(response.error().message())
        return {t.name(): t.as_numpy() for t in response.output_tensors()}

    def embed(self, inputs: InputSet) -> Any:
        tokens = self._step(self.tokenizer, inputs)
        (hidden,) = self.encoder.run(["token_embeddings"], tokens)
        pooled = {"token_embeddings": hidden, "attention_mask": tokens["attention_mask"]}
        return self._step(self.pool, pooled)["embedding"]

    def items_per_s(self, pool: Sequence[InputSet], window_s: float) -> float:
        """Requests per second, one after another, for ``window_s``."""
        done, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < window_s or done < 10:
            self.embed(pool[done % len(pool)])
            done += 1
        return done / elapsed


async def _start(ctx: Context, dep: Deployment) -> list[Any]:
    """A worker per step and the ensemble's runner, each up in its registry."""
    procs: list[Any] = []
    for model in STEPS:
        name = f"{dep.prefix}-worker-{model}"
        procs.append(ctx.procs.start(WorkerProcess(dep, model, ctx.procs.log_dir, name=name)))
    argv = ["-m", "plaza.workers.ensemble", "--worker.model", ENSEMBLE]
    procs.append(ctx.procs.spawn(f"{dep.prefix}-runner", argv, dep.env()))
    for model in (*STEPS, ENSEMBLE):
        await wait_workers(dep, model, 1, ctx.procs)
    return procs


def _mean_batch(before: StatsSnapshot | None, after: StatsSnapshot | None) -> float:
    moved = batches_between(before, after) or {}
    runs = sum(moved.values())
    return sum(size * n for size, n in moved.items()) / runs if runs else float("nan")


async def text_embed(ctx: Context) -> Report:
    """text_embed (tokenizer -> encoder -> pool) through Kafka at c=64 vs its three stages
    in one process, one request at a time."""
    dep = ctx.deployment("text-embed", dict.fromkeys((ENSEMBLE, *STEPS)))
    pool = text_inputs()
    procs = await _start(ctx, dep)
    local = InProcessPipeline(dep.repository, os.cpu_count() or 1)
    target = KafkaTarget(dep.settings(), ENSEMBLE, pool, timeout_s=60, label="plaza text_embed")
    steps = {m: KafkaTarget(dep.settings(), m, pool, label=m) for m in STEPS}
    for t in (target, *steps.values()):
        await t.start()
    points: list[PointResult] = []
    lane: list[float] = []
    batches: dict[str, list[float]] = {m: [] for m in STEPS}
    window = 1.0 if ctx.quick else 3.0
    try:
        local.items_per_s(pool, 0.5)  # warm the session
        for _ in range(ctx.rounds + 1):
            before = {m: await t.stats() for m, t in steps.items()}
            points.append(
                await measure_logged(target, Load("concurrency", CONCURRENCY), ctx.window())
            )
            for m, t in steps.items():
                batches[m].append(_mean_batch(before[m], await t.stats()))
            lane.append(local.items_per_s(pool, window))
            print(f"   in-process, one at a time: {lane[-1]:.0f}/s", flush=True)
    finally:
        for t in (target, *steps.values()):
            await t.stop()
    ctx.procs.stop(procs)
    ratios = [p.throughput / x for p, x in zip(points, lane, strict=True) if x > 0]
    return {
        "model": f"{ENSEMBLE} ensemble: {' -> '.join(STEPS)}",
        "inputs": "one plain English sentence per request (plaza.loadgen.inputs.sentences)",
        "load": f"concurrency {CONCURRENCY}, Kafka path (SDK -> ensemble runner -> steps)",
        "plaza": [point_summary(p) for p in points],
        "step_mean_batch": {m: statistics.median(v) for m, v in batches.items()},
        "in_process_items_per_s": lane,
        "ratios": {"plaza_text_embed_vs_in_process_one_at_a_time": statistics.median(ratios)},
    }
