"""What the runner tells the worker's statistics, through ``WorkerMetrics``: the durations
of a decoupled request closed by the final flag alone, and the executions of a failed batch
retried in halves (each call that ran, not the calls that raised)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from plaza.client import make_request
from plaza.contract import InferRequest, InferResult
from plaza.metrics import render
from plaza.modelconfig import ModelSpec, parse_model_config
from plaza.naming import Names
from plaza.settings import WorkerSettings
from plaza.tensors import Tensor
from plaza.workers.backends.base import Send
from plaza.workers.gpu_metrics import GpuCollector
from plaza.workers.metrics import WorkerMetrics
from plaza.workers.runner import BatchRunner, Execution, WorkItem
from tests.metrics_support import samples, value

_US = 1000  # ns


def _spec(decoupled: bool) -> ModelSpec:
    policy = "model_transaction_policy { decoupled: true }" if decoupled else ""
    return parse_model_config(
        f"""
        name: "m" backend: "python" max_batch_size: 8
        input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        {policy}
        """,
        source="m/config.pbtxt",
        default_name="m",
    )


class _NoDriver:
    def nvmlInit(self) -> None:
        raise RuntimeError("NVML Shared Library Not Found")


def _metrics(decoupled: bool = False) -> WorkerMetrics:
    settings = WorkerSettings(metrics_port=-1, summary_latencies=True)
    m = WorkerMetrics("m", Names(), settings, stats_ttl_s=60, gpu=GpuCollector(nvml=_NoDriver()))
    m.start([1], pending=lambda: 0, decoupled=decoupled)
    return m


def _item(value: int) -> WorkItem:
    request = make_request("m", {"IN": np.array([[value]], np.int32)})
    return WorkItem(request=request, rows=1, version=1)


# -- a decoupled request closed by the final flag alone --------------------------------------


class _RespondThenClose:
    """Triton's usual decoupled pattern: a response, then ``send(flags=FINAL)`` alone."""

    def execute_decoupled(self, requests: Sequence[InferRequest], send: Send) -> None:
        for i, request in enumerate(requests):
            time.sleep(0.001)  # the model's work: its compute time is not nothing
            send(i, (Tensor.from_numpy("OUT", request.inputs[0].to_numpy()),), False)
            send(i, None, True)


async def test_a_decoupled_request_closed_by_the_final_flag_alone_counts_its_durations() -> None:
    m = _metrics(decoupled=True)
    runner = BatchRunner(
        _spec(decoupled=True),
        {1: _RespondThenClose()},  # type: ignore[dict-item]
        observer=m.executed,
        response_observer=m.responded,
    )
    it = _item(7)
    it.received -= 0.1  # it waited 100 ms in the batcher
    (final,) = await runner.run([it], responses=lambda it, r: None)
    m.answered([(final, None)])

    assert final.empty and final.final and final.index == 1
    timing = final.timing_us
    assert timing["queue"] >= 100_000 and timing["compute_infer"] > 0
    s = m.stats["1"]
    assert s.success.count == s.queue.count == s.compute_infer.count == 1
    assert s.success.ns == sum(timing.values()) * _US > 0
    assert s.queue.ns == timing["queue"] * _US
    assert s.compute_infer.ns == timing["compute_infer"] * _US
    assert s.execution_count == 1 and s.inference_count == 1
    assert s.batches[1].compute_infer.ns == timing["compute_infer"] * _US

    got = samples(render(m.registry).decode())
    v1 = {"model": "m", "version": "1"}
    assert value(got, "nv_inference_request_duration_us", **v1) == s.success.ns // _US
    assert value(got, "nv_inference_queue_duration_us", **v1) == timing["queue"]
    assert value(got, "nv_inference_compute_infer_duration_us", **v1) == timing["compute_infer"]
    summary_sum = value(got, "nv_inference_request_summary_us_sum", **v1)
    assert summary_sum is not None and summary_sum > 0


# -- a failed batch retried in halves --------------------------------------------------------


class _Fragile:
    """Fails any batch holding a negative row; remembers the rows of every call."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def infer(self, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
        x = inputs["IN"]
        self.calls.append(len(x))
        if (x < 0).any():
            raise RuntimeError("bad row")
        return {"OUT": x}


async def test_a_failed_batch_retried_in_halves_counts_each_execution_that_ran() -> None:
    m = _metrics()
    backend = _Fragile()
    runner = BatchRunner(_spec(decoupled=False), {1: backend}, observer=m.executed)  # type: ignore[dict-item]
    results = await runner.run([_item(v) for v in (1, 2, 3, -1)])

    assert backend.calls == [4, 2, 2, 1, 1]
    assert [r.error.code if r.error else "ok" for r in results] == ["ok", "ok", "ok", "model_error"]
    s = m.stats["1"]
    assert s.execution_count == 2 and s.inference_count == 3  # the 2-row and the 1-row calls
    assert m.batch_sizes() == {2: 1, 1: 1}
    first, _, third, _ = results
    assert s.batches[2].compute_infer.ns == first.timing_us["compute_infer"] * _US
    assert s.batches[1].compute_infer.ns == third.timing_us["compute_infer"] * _US

    got = samples(render(m.registry).decode())
    v1 = {"model": "m", "version": "1"}
    assert value(got, "nv_inference_exec_count", **v1) == 2
    assert value(got, "plaza_inference_batch_size_count", **v1) == 2
    assert value(got, "plaza_inference_batch_size_sum", **v1) == 3


async def test_the_observer_hears_of_each_call_that_ran_and_warmup_of_none() -> None:
    heard: list[tuple[list[int], list[str]]] = []

    def observe(items: Sequence[WorkItem], results: list[InferResult]) -> None:
        values = [int(it.request.inputs[0].to_numpy()[0, 0]) for it in items]
        heard.append((values, ["error" if r.error else "ok" for r in results]))

    runner = BatchRunner(_spec(decoupled=False), {1: _Fragile()}, observer=observe)  # type: ignore[dict-item]
    await runner.run([_item(v) for v in (1, 2, 3, -1)])
    assert heard == [([1, 2], ["ok", "ok"]), ([3], ["ok"])]

    heard.clear()
    ran: list[Execution] = []
    results = runner.run_group([_item(v) for v in (4, -4)], ran=ran)  # as warmup: unobserved
    assert [r.error is None for r in results] == [True, False]
    assert heard == [] and [[r.error is None for r in done] for _, done in ran] == [[True]]
