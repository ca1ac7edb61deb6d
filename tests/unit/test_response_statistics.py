"""Triton's per-response statistics of decoupled models, without Kafka or Redis: counting a
response, timing it in the runner, the hash fields and their sum over workers, Triton's
JSON and protobuf, and the first-response histogram."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from plaza.client import make_request
from plaza.contract import ErrorInfo, InferRequest, InferResult
from plaza.errors import InvalidInput
from plaza.gateway.grpc_front import InferenceServicer
from plaza.metrics import render
from plaza.modelconfig import parse_model_config
from plaza.naming import METRIC_FIRST_RESPONSE_HISTOGRAM, Names
from plaza.settings import WorkerSettings
from plaza.statistics import RESPONSE_PHASES, ModelStatistics, increments
from plaza.tensors import Tensor
from plaza.workers.backends.base import Answer, Send
from plaza.workers.backends.pb_utils import TritonError
from plaza.workers.backends.python_errors import plaza_code, triton_code
from plaza.workers.gpu_metrics import GpuCollector
from plaza.workers.metrics import WorkerMetrics
from plaza.workers.response_statistics import (
    FIRST_RESPONSE_BUCKETS_MS,
    FirstResponses,
    ResponseTiming,
    count_response,
)
from plaza.workers.runner import BatchRunner, WorkItem
from tests.metrics_support import samples, value

MS = 1_000_000


def response(
    index: int, *, empty: bool = False, error: str = "", version: str = "1"
) -> InferResult:
    failure = ErrorInfo(error, "no") if error else None
    return InferResult("r", "m", "1", error=failure, index=index, empty=empty)


def timing(infer_ms: int = 4, output_ms: int = 1, since_ms: int = 9) -> ResponseTiming:
    return ResponseTiming(infer_ms * MS, output_ms * MS, since_ms * MS)


def durations(stats: ModelStatistics, index: int) -> dict[str, tuple[int, int]]:
    entry = stats.responses[index]
    return {p: (getattr(entry, p).count, getattr(entry, p).ns) for p in RESPONSE_PHASES}


# -- counting one response -------------------------------------------------------------------


def test_each_kind_of_response_counts_as_triton_counts_it() -> None:
    stats = ModelStatistics()
    count_response(stats, response(0), timing(4, 1))
    count_response(stats, response(0, error="model_error"), timing(6, 2))
    count_response(stats, response(1, error="cancelled"), timing(3, 1))
    count_response(stats, response(2, empty=True), timing(5, 7))
    assert durations(stats, 0) == {
        "compute_infer": (2, 10 * MS),
        "compute_output": (2, 3 * MS),
        "success": (1, 5 * MS),  # its compute_infer and compute_output together
        "fail": (1, 8 * MS),
        "empty_response": (0, 0),
        "cancel": (0, 0),
    }
    assert durations(stats, 1)["cancel"] == (1, 4 * MS) and durations(stats, 1)["fail"] == (0, 0)
    # an empty final has nothing to output: its time is the model's alone
    assert durations(stats, 2) == {
        "compute_infer": (1, 5 * MS),
        "compute_output": (0, 0),
        "success": (0, 0),
        "fail": (0, 0),
        "empty_response": (1, 5 * MS),
        "cancel": (0, 0),
    }


# -- the hash, the sum over workers, the JSON ------------------------------------------------


def test_response_statistics_round_trip_through_hash_fields() -> None:
    stats = ModelStatistics()
    count_response(stats, response(0), timing())
    count_response(stats, response(12, empty=True), timing())
    fields = stats.fields()
    assert fields["response.0.success.count"] == 1 and fields["response.12.empty_response.ns"]
    raw = {k.encode(): str(v).encode() for k, v in fields.items()}
    raw[b"response.x.success.count"] = b"3"  # malformed or from a newer worker: ignored
    raw[b"response.1.tokens.count"] = b"3"
    assert ModelStatistics.from_fields(raw) == stats


def test_two_workers_flushes_add_up_per_index() -> None:
    """What the flush script does with HINCRBY: each worker's increments added per field."""
    hash_fields: dict[str, int] = {}
    for worker in range(2):
        stats = ModelStatistics()
        for _ in range(worker + 1):  # 1 request on the first worker, 2 on the second
            count_response(stats, response(0), timing())
            count_response(stats, response(1, empty=True), timing())
        for name, amount in increments(stats.fields(), {}).items():
            hash_fields[name] = hash_fields.get(name, 0) + amount
    summed = ModelStatistics.from_fields(hash_fields).to_triton("m", "1")["response_stats"]
    assert list(summed) == ["0", "1"]
    assert summed["0"]["success"]["count"] == 3 and summed["0"]["compute_output"]["count"] == 3
    assert summed["1"]["empty_response"] == {"count": 3, "ns": 3 * 4 * MS}


def test_tritons_json_and_protobuf_shape() -> None:
    stats = ModelStatistics()
    for index in (10, 2, 0):
        count_response(stats, response(index), timing(2, 1))
    doc = stats.to_triton("m", "1")
    assert list(doc["response_stats"]) == ["0", "2", "10"]  # by index, as strings
    assert doc["response_stats"]["2"] == {
        "compute_infer": {"count": 1, "ns": 2 * MS},
        "compute_output": {"count": 1, "ns": MS},
        "success": {"count": 1, "ns": 3 * MS},
        "fail": {"count": 0, "ns": 0},
        "empty_response": {"count": 0, "ns": 0},
        "cancel": {"count": 0, "ns": 0},
    }
    assert ModelStatistics().to_triton("m", "1")["response_stats"] == {}  # a model not decoupled


async def test_the_grpc_front_fills_model_statistics_response_stats() -> None:
    decoupled = ModelStatistics()
    count_response(decoupled, response(0), timing(2, 1))
    count_response(decoupled, response(1, empty=True), timing(5, 0))
    body = {
        "model_stats": [decoupled.to_triton("d", "1"), ModelStatistics().to_triton("plain", "1")]
    }

    async def statistics(name: str = "", version: str = "") -> dict[str, Any]:
        return body

    service = SimpleNamespace(
        settings=SimpleNamespace(gateway=SimpleNamespace(api_key=None)), statistics=statistics
    )
    servicer = InferenceServicer(service)  # type: ignore[arg-type]
    answer = await servicer.ModelStatistics(pb.ModelStatisticsRequest(), None)
    first, plain = answer.model_stats
    assert sorted(first.response_stats) == ["0", "1"]
    assert first.response_stats["0"].success.count == 1
    assert first.response_stats["0"].success.ns == 3 * MS
    assert first.response_stats["1"].empty_response.count == 1
    assert first.response_stats["1"].compute_output.count == 0
    assert len(plain.response_stats) == 0


# -- the worker's metrics: statistics and the first-response histogram -----------------------


def worker_metrics(decoupled: bool) -> WorkerMetrics:
    m = WorkerMetrics(
        "m",
        Names(),
        WorkerSettings(metrics_port=-1),
        stats_ttl_s=60,
        gpu=GpuCollector(nvml=_NoDriver()),
    )
    m.start([1], pending=lambda: 0, decoupled=decoupled)
    return m


class _NoDriver:
    def nvmlInit(self) -> None:
        raise RuntimeError("NVML Shared Library Not Found")


def item() -> WorkItem:
    x = np.zeros((1, 2), dtype=np.int32)
    return WorkItem(request=make_request("m", {"IN": x}), rows=1, version=1)


def test_a_decoupled_models_first_responses_make_tritons_histogram() -> None:
    m = worker_metrics(decoupled=True)
    for since_ms in (50, 700):  # two requests: their first responses
        m.responded(item(), response(0), timing(since_ms=since_ms))
        m.responded(item(), response(1, empty=True), timing(since_ms=since_ms + 1))
    m.responded(item(), response(0, empty=True), timing(since_ms=3))  # closed without any
    assert m.stats["1"].responses[0].compute_infer.count == 3
    assert m.stats["1"].responses[1].empty_response.count == 2
    got = samples(render(m.registry).decode())
    name = METRIC_FIRST_RESPONSE_HISTOGRAM
    assert name == "nv_inference_first_response_histogram_ms"

    def bucket(le: str) -> float | None:
        return value(got, f"{name}_bucket", le=le, model="m", version="1")

    assert [bucket(le) for le in ("100.0", "500.0", "2000.0", "5000.0", "+Inf")] == [1, 1, 2, 2, 2]
    assert value(got, f"{name}_count", model="m", version="1") == 2
    assert value(got, f"{name}_sum", model="m", version="1") == 750


def test_a_model_not_decoupled_has_no_first_response_histogram() -> None:
    m = worker_metrics(decoupled=False)
    got = samples(render(m.registry).decode())
    assert not [k for k in got if k[0].startswith(METRIC_FIRST_RESPONSE_HISTOGRAM)]
    assert m.stats["1"].to_triton("m", "1")["response_stats"] == {}


def test_first_responses_buckets_are_tritons_and_cumulative() -> None:
    assert FIRST_RESPONSE_BUCKETS_MS == (100.0, 500.0, 2000.0, 5000.0)
    histogram = FirstResponses()
    for ms in (100, 100.5, 9000, 0):
        histogram.observe(int(ms * MS))
    assert histogram.cumulative() == [
        ("100.0", 2),
        ("500.0", 3),
        ("2000.0", 3),
        ("5000.0", 3),
        ("+Inf", 4),
    ]


# -- the runner: every response of a decoupled batch, timed ----------------------------------

SPEC = parse_model_config(
    """
    name: "m" backend: "python" max_batch_size: 8
    input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    model_transaction_policy { decoupled: true }
    """,
    source="m/config.pbtxt",
    default_name="m",
)


class Streaming:
    """A decoupled backend: request i answers i responses, then the final flag alone; a
    request whose input is -1 answers an error and is then left open (the batch fails)."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def execute_decoupled(self, requests: Sequence[InferRequest], send: Send) -> None:
        for i, request in enumerate(requests):
            n = int(request.inputs[0].to_numpy().reshape(-1)[0])
            if n < 0:
                send(i, InvalidInput("negative"), False)
                continue
            for k in range(n):
                out: Answer = (Tensor.from_numpy("OUT", np.array([[k]], np.int32)),)
                send(i, out, False)
            send(i, None, True)
        if self.fail:
            raise RuntimeError("the model's process died")


def items(*counts: int) -> list[WorkItem]:
    return [
        WorkItem(request=make_request("m", {"IN": np.array([[n]], np.int32)}), rows=1, version=1)
        for n in counts
    ]


Observed = list[tuple[str, int, str, ResponseTiming]]


def runner(observed: Observed, backend: Streaming) -> BatchRunner:
    def observe(it: WorkItem, result: InferResult, t: ResponseTiming) -> None:
        kind = "empty" if result.empty else result.error.code if result.error else "ok"
        observed.append((it.request.id, result.index, kind, t))

    return BatchRunner(SPEC, {1: backend}, response_observer=observe)  # type: ignore[dict-item]


async def test_the_runner_tells_of_every_response_numbered_and_timed() -> None:
    observed: Observed = []
    batch = items(2, 0)
    finals = await runner(observed, Streaming()).run(batch, responses=lambda it, r: None)
    assert [r.index for r in finals] == [2, 0] and all(r.empty for r in finals)
    first, second = (it.request.id for it in batch)
    assert [(rid, index, kind) for rid, index, kind, _ in observed] == [
        (first, 0, "ok"),
        (first, 1, "ok"),
        (first, 2, "empty"),
        (second, 0, "empty"),
    ]
    for _, _, _, t in observed:
        assert t.infer_ns >= 0 and t.output_ns >= 0 and t.since_request_ns >= t.infer_ns


async def test_a_failed_batch_closes_its_open_requests_with_a_counted_failure() -> None:
    observed: Observed = []
    batch = items(1, -1)
    finals = await runner(observed, Streaming(fail=True)).run(batch, responses=lambda it, r: None)
    assert finals[0].empty and finals[1].error is not None and finals[1].index == 1
    assert [(index, kind) for _, index, kind, _ in observed] == [
        (0, "ok"),
        (1, "empty"),
        (0, "invalid_input"),
        (1, "model_error"),  # the close, after the error response it sent
    ]


def test_warmup_runs_stay_out_of_the_response_statistics() -> None:
    observed: Observed = []
    (final,) = runner(observed, Streaming()).run_group(items(3))
    assert final.index == 3 and final.empty
    assert observed == []


def test_a_models_cancelled_error_is_a_cancel_not_a_failure() -> None:
    """pb_utils.TritonError.CANCELLED keeps its meaning across the Python backend's edge."""
    assert plaza_code(TritonError.CANCELLED) == "cancelled"
    assert triton_code("cancelled") == TritonError.CANCELLED
    stats = ModelStatistics()
    count_response(stats, response(0, error=plaza_code(TritonError.CANCELLED)), timing())
    count_response(stats, response(0, error=plaza_code(TritonError.INTERNAL)), timing())
    entry = stats.responses[0]
    assert (entry.cancel.count, entry.fail.count) == (1, 1)
