"""Triton's latency summaries (``workers/latency_summaries.py``): the window's quantiles
with a fake clock, the bounded sample, the setting's parse, and the worker's /metrics."""

from __future__ import annotations

import math
import random

import pytest
from prometheus_client.parser import text_string_to_metric_families

from plaza.contract import ErrorInfo, InferResult
from plaza.metrics import render
from plaza.naming import Names
from plaza.settings import WorkerSettings, parse_quantiles
from plaza.workers.latency_summaries import (
    AGE_BUCKETS,
    MAX_AGE_S,
    MAX_SAMPLES,
    LatencySummaries,
    WindowQuantiles,
    sample_size,
)
from plaza.workers.metrics import WorkerMetrics


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_window_under_its_capacity_gives_the_exact_quantiles() -> None:
    window = WindowQuantiles(10_000, clock=Clock())
    values = list(range(1, 1001))
    random.Random(1).shuffle(values)
    for v in values:
        window.observe(v)
    assert window.quantiles([0.0, 0.5, 0.9, 0.99, 1.0]) == [1.0, 500.0, 900.0, 990.0, 1000.0]
    assert window.count == 1000 and window.sum == sum(values)


def test_values_older_than_the_window_leave_it_but_stay_in_count_and_sum() -> None:
    clock = Clock()
    window = WindowQuantiles(100, clock=clock)
    for v in (5, 6, 7):
        window.observe(v)
    clock.now += MAX_AGE_S / AGE_BUCKETS  # a new step
    window.observe(100)
    assert window.quantiles([0.5, 1.0]) == [6.0, 100.0]
    clock.now += MAX_AGE_S - MAX_AGE_S / AGE_BUCKETS  # the first step is a window old
    assert window.quantiles([0.5]) == [100.0]
    clock.now += MAX_AGE_S
    assert all(math.isnan(q) for q in window.quantiles([0.5, 0.99]))  # nothing recent
    assert window.count == 4 and window.sum == 118


def test_a_full_sample_stays_bounded_and_near_the_true_quantiles() -> None:
    clock = Clock()
    window = WindowQuantiles(400, clock=clock, rng=random.Random(7))
    for v in range(20_000):
        window.observe(v)
    clock.now += MAX_AGE_S / AGE_BUCKETS
    for v in range(20_000, 22_000):  # a second step, of another size, weighs its count
        window.observe(v)
    assert all(len(step.kept) <= 400 for step in window._steps)
    median, p90 = window.quantiles([0.5, 0.9])
    # 800 kept values: rank error about sqrt(.25 / 800) = 1.8% of 22,000; allow 4x that
    assert abs(median - 11_000) < 0.07 * 22_000
    assert abs(p90 - 19_800) < 0.05 * 22_000


def test_the_sample_size_meets_the_tightest_error() -> None:
    assert sample_size(parse_quantiles("0.5:0.05")) == 100
    assert sample_size(parse_quantiles("0.5:0.05,0.99:0.001")) == 9900
    assert sample_size(parse_quantiles("0.999:0.00001")) == MAX_SAMPLES


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("0.5", "is not <quantile>:<error>"),
        ("0.5:x", "is not <quantile>:<error>"),
        ("1.5:0.01", "must be in [0, 1]"),
        ("0.5:0", "its error in (0, 1)"),
        ("0.5:0.05,", "is not <quantile>:<error>"),
    ],
)
def test_bad_quantiles_are_refused_by_the_setting(text: str, why: str) -> None:
    with pytest.raises(ValueError, match="summary_quantiles") as caught:
        WorkerSettings(summary_quantiles=text)
    assert why in str(caught.value)


def _result(queue: int, infer: int, *, error: bool = False) -> InferResult:
    timing = {"queue": queue, "compute_input": 1, "compute_infer": infer, "compute_output": 2}
    if error:
        return InferResult("r", "m", "1", error=ErrorInfo("model_error", "no"))
    return InferResult("r", "m", "1", timing_us=timing)


def _scrape(m: WorkerMetrics) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Summary families by name: their samples by (sample name, labels)."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(render(m.registry).decode()):
        if family.type == "summary":
            out[family.name] = {
                (("", s.name), *sorted(s.labels.items())): s.value for s in family.samples
            }
    return out


def _worker(settings: WorkerSettings, *, response_cache: bool = False) -> WorkerMetrics:
    m = WorkerMetrics("m", Names(), settings, stats_ttl_s=60)
    m.start([1], pending=lambda: 0, response_cache=response_cache)
    return m


def test_the_worker_serves_tritons_summaries_when_asked() -> None:
    on = WorkerSettings(metrics_port=-1, summary_latencies=True, summary_quantiles="0.5:0.05")
    m = _worker(on)
    m.answered([(_result(10, 100), None), (_result(30, 300), None), (_result(20, 200), None)])
    m.answered([(_result(0, 0, error=True), None)])  # a failure has no phases
    families = _scrape(m)
    assert sorted(families) == [
        "nv_inference_compute_infer_summary_us",
        "nv_inference_compute_input_summary_us",
        "nv_inference_compute_output_summary_us",
        "nv_inference_queue_summary_us",
        "nv_inference_request_summary_us",
    ]
    labels = (("model", "m"), ("version", "1"))
    request = families["nv_inference_request_summary_us"]
    assert request[(("", "nv_inference_request_summary_us_count"), *labels)] == 3
    assert request[(("", "nv_inference_request_summary_us_sum"), *labels)] == 113 + 333 + 223
    at_median = (("model", "m"), ("quantile", "0.5"), ("version", "1"))
    assert request[(("", "nv_inference_request_summary_us"), *at_median)] == 223  # 20+1+200+2
    queue = families["nv_inference_queue_summary_us"]
    assert queue[(("", "nv_inference_queue_summary_us"), *at_median)] == 20


def test_no_summaries_by_default_and_no_request_summary_with_a_response_cache() -> None:
    m = _worker(WorkerSettings(metrics_port=-1))
    m.answered([(_result(10, 100), None)])
    assert m.summaries is None and _scrape(m) == {}
    cached = _worker(WorkerSettings(metrics_port=-1, summary_latencies=True), response_cache=True)
    cached.answered([(_result(10, 100), None)])
    assert "nv_inference_request_summary_us" not in _scrape(cached)
    assert "nv_inference_queue_summary_us" in _scrape(cached)


def test_summaries_observe_every_phase_per_version() -> None:
    summaries = LatencySummaries(parse_quantiles("0.5:0.05"), seed=3)
    summaries.observe("1", 1, 2, 3, 4)
    summaries.observe("2", 10, 20, 30, 40)
    assert summaries.read("request") == [("1", [10.0], 1, 10.0), ("2", [100.0], 1, 100.0)]
    assert summaries.read("compute_output") == [("1", [4.0], 1, 4.0), ("2", [40.0], 1, 40.0)]
