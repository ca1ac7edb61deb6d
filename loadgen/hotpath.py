"""The worker's per-request Python, without Kafka, Redis or a model: microseconds a stage.

    python -m plaza.loadgen.hotpath [--model identity] [--requests 20000] [--batch 64]

Builds ``--requests`` request envelopes for the model (loadgen's input pool, one row each),
then times, per request, the stages the worker runs for each one on the Kafka path:
``admit`` (decode, validate, the WorkItem), the batcher (``add``, then ``decide`` in batches
of ``--batch``), the runner's stacking of a batch's inputs and split of its outputs into
results (an echo of the stacked inputs stands in for the model), ``encode_result``, and the
metrics of the answers. It is the CPU of one thread (``time.process_time`` over one
thread; in the worker the stacking runs on the executor's thread, the rest on the
event loop's), with no I/O: what a change to these modules saves, apart from the
network's noise. Prints a line per
stage and the sum; ``--json PATH`` writes them.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiokafka.structs import TopicPartition

from plaza.batching import BatchingPolicy, DynamicBatcher
from plaza.codec import encode_request, encode_result
from plaza.contract import InferRequest, ReplyTo
from plaza.loadgen import report_json
from plaza.loadgen.inputs import input_pool
from plaza.model_control import model_spec
from plaza.naming import Names
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings
from plaza.tensors import Tensor
from plaza.workers.admission import admit
from plaza.workers.metrics import WorkerMetrics
from plaza.workers.runner import BatchRunner, WorkItem, stack_inputs


def _timed(fn: Callable[[], Any], n: int, best_of: int) -> float:
    """CPU microseconds per request of ``fn`` (which handles ``n`` requests), best of."""
    best = float("inf")
    for _ in range(best_of):
        t0 = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t0)
    return best / n * 1e6


def measure(model: str, requests: int, batch: int, best_of: int = 5) -> dict[str, float]:
    """Microseconds of CPU per request, by stage."""
    settings = PlazaSettings()
    names: Names = settings.names
    repo = ModelRepository(settings.repository)
    spec = model_spec(repo, model)
    versions = [mv.version for mv in repo.served_versions(model, spec)]
    pool = input_pool(spec)
    stream = names.reply_stream("bench")
    tp = TopicPartition(names.request_topic(model, 1), 0)
    values = [
        encode_request(
            InferRequest(
                id=f"r{i}",
                model=model,
                version="",
                inputs=tuple(Tensor.from_numpy(k, a) for k, a in pool[i % len(pool)].items()),
                reply=ReplyTo(stream),
                created_ms=1,
            )
        )
        for i in range(requests)
    ]
    max_bytes = settings.kafka.max_request_bytes
    items: list[WorkItem] = []

    def admit_all() -> None:
        items.clear()
        for off, value in enumerate(values):
            verdict = admit(
                value,
                spec,
                versions,
                max_bytes=max_bytes,
                names=names,
                worker_id="w",
                partition=tp,
                offset=off,
            )
            assert isinstance(verdict, WorkItem), verdict
            items.append(verdict)

    policy = BatchingPolicy.from_spec(spec)

    def batch_all() -> None:
        batcher: DynamicBatcher[WorkItem] = DynamicBatcher(policy)
        for it in items:
            batcher.add(it, size=it.rows, priority=it.request.priority or 1, deadline=None)
        while len(batcher):
            batcher.decide(backlog=len(batcher))

    admit_all()
    runner = BatchRunner(spec, {}, None, "w")
    batches = [items[i : i + batch] for i in range(0, len(items), batch)]
    stacked = []
    for b in batches:
        arrays = stack_inputs(b, True)
        stacked.append({o.name: next(iter(arrays.values())) for o in spec.outputs})
    results: list[Any] = []

    def split_all() -> None:
        results.clear()
        for b, outs in zip(batches, stacked, strict=True):
            results.extend(runner._split(b, outs, 0.0, 0.0, 0.0))

    def encode_all() -> None:
        for r in results:
            encode_result(r)

    metrics = WorkerMetrics(model, names, settings.worker, stats_ttl_s=60)
    metrics.start(versions, pending=lambda: 0)
    answers = [(r, stream) for r in results]

    def answered_all() -> None:
        for i in range(0, len(answers), batch):
            metrics.answered(answers[i : i + batch])

    split_all()
    answers[:] = [(r, stream) for r in results]

    def stack_all() -> None:
        for b in batches:
            stack_inputs(b, True)

    stages = {"admit": admit_all, "batcher": batch_all, "stack": stack_all, "split": split_all}
    out = {name: _timed(fn, requests, best_of) for name, fn in stages.items()}
    out["encode_result"] = _timed(encode_all, requests, best_of)
    out["metrics"] = _timed(answered_all, requests, best_of)
    out["sum"] = sum(out.values())
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="identity")
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    out = measure(args.model, args.requests, args.batch)
    for name, us in out.items():
        print(f"{name:14s} {us:7.2f} us/request")
    if args.json:
        args.json.write_text(report_json.dumps(out), encoding="utf-8")


if __name__ == "__main__":
    main()
