"""The worker's failure counter: a series per served version and Triton reason from the start."""

from __future__ import annotations

from plaza.contract import ErrorInfo, InferResult
from plaza.metrics import render
from plaza.naming import Names
from plaza.settings import WorkerSettings
from plaza.workers.gpu_metrics import GpuCollector
from plaza.workers.metrics import WorkerMetrics
from tests.metrics_support import named, samples

FAILURE = "nv_inference_request_failure"


def failures(m: WorkerMetrics) -> dict[tuple[str, str], float]:
    found = named(samples(render(m.registry).decode()), FAILURE)
    return {
        (dict(labels)["version"], dict(labels)["reason"]): v for (_, labels), v in found.items()
    }


def test_every_served_version_has_each_reason_at_zero_until_it_fails() -> None:
    m = WorkerMetrics(
        "m",
        Names(),
        WorkerSettings(metrics_port=-1),
        stats_ttl_s=60,
        gpu=GpuCollector(nvml=object()),
    )
    m.start([1, 2], pending=lambda: 0)
    reasons = ("BACKEND", "CANCELED", "OTHER", "REJECTED")
    assert failures(m) == {(v, r): 0 for v in ("1", "2") for r in reasons}
    late = InferResult(id="r", model="m", version="2", error=ErrorInfo("timeout", "late"))
    m.answered([(late, None)])
    assert failures(m) == {(v, r): int((v, r) == ("2", "REJECTED")) for v in "12" for r in reasons}
