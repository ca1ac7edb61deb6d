"""loadgen's pure parts: percentiles, stability, ranges, batch estimates, stats parsing."""

from __future__ import annotations

import math

import pytest

from plaza.loadgen.summary import (
    estimate_batch_sizes,
    is_stable,
    mean_batch_size,
    relative_spread,
    server_split,
    size_histogram,
    summarize,
)
from plaza.loadgen.sweep import parse_range
from plaza.loadgen.targets import batches_between, parse_triton_stats, split_between


def test_summarize_percentiles_in_ms() -> None:
    s = summarize([i / 1000 for i in range(1, 101)])  # 1..100 ms
    assert s.count == 100
    assert s.p50_ms == pytest.approx(50.5)
    assert s.p99_ms == pytest.approx(99.01)
    assert s.max_ms == pytest.approx(100.0)
    assert summarize([]).count == 0 and math.isnan(summarize([]).p50_ms)


def test_stability_needs_count_windows_within_tolerance() -> None:
    assert is_stable([100, 104, 98], [10, 10.5, 10.2], tolerance=0.1, count=3)
    assert not is_stable([100, 104], [10, 10.5], tolerance=0.1, count=3)
    assert not is_stable([100, 130, 98], [10, 10, 10], tolerance=0.1, count=3)
    assert not is_stable([100, 100, 100], [10, 15, 10], tolerance=0.1, count=3)
    assert is_stable([50, 100, 104, 98], [1, 10, 10.5, 10.2], tolerance=0.1, count=3)
    assert relative_spread([0.0, 1.0]) == math.inf


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("1:64:x2", [1, 2, 4, 8, 16, 32, 64]),
        ("100:400:100", [100, 200, 300, 400]),
        ("1:10:x4", [1, 4]),
        ("1,8,64", [1, 8, 64]),
        ("16", [16]),
        ("1:3", [1, 2, 3]),
    ],
)
def test_parse_range(text: str, values: list[float]) -> None:
    assert parse_range(text) == values


@pytest.mark.parametrize("text", ["0:4", "8:4", "1:8:x1", "1:8:0", "1:2:3:4"])
def test_parse_range_rejects_bad_ranges(text: str) -> None:
    with pytest.raises(ValueError):
        parse_range(text)


def test_server_split_means() -> None:
    split = server_split(
        [
            {"queue": 100, "compute_input": 10, "compute_infer": 1000, "compute_output": 20},
            {"queue": 300, "compute_input": 30, "compute_infer": 1000, "compute_output": 40},
        ]
    )
    assert split is not None
    assert (split.queue_us, split.compute_infer_us, split.server_us) == (200, 1000, 1250)
    assert server_split([]) is None


def test_batch_sizes_estimated_from_shared_timings() -> None:
    batch_a = {"queue": 1, "compute_input": 50, "compute_infer": 900, "compute_output": 3}
    batch_b = {"queue": 2, "compute_input": 51, "compute_infer": 880, "compute_output": 3}
    samples = [(1.000, "w1", batch_a)] * 3 + [(1.002, "w1", batch_b)] * 2
    samples += [(2.000, "w1", batch_a)]  # same timings much later: another batch
    samples += [(1.000, "w2", batch_a)]  # same timings, another worker
    assert sorted(estimate_batch_sizes(samples)) == [1, 1, 2, 3]
    assert size_histogram([3, 1, 3]) == {1: 1, 3: 2}
    assert mean_batch_size([3, 1]) == 2.0


def test_triton_statistics_are_parsed_and_differenced() -> None:
    def doc(success: int, queue_ns: int, batches: dict[int, int]) -> dict[str, object]:
        phase = {"count": success, "ns": 0}
        return {
            "model_stats": [
                {
                    "inference_stats": {
                        "success": phase,
                        "queue": {"count": success, "ns": queue_ns},
                        "compute_input": phase,
                        "compute_infer": {"count": success, "ns": success * 2_000_000},
                        "compute_output": phase,
                    },
                    "batch_stats": [
                        {"batch_size": k, "compute_infer": {"count": v, "ns": 0}}
                        for k, v in batches.items()
                    ],
                }
            ]
        }

    before = parse_triton_stats(doc(10, 10_000_000, {1: 10}))
    after = parse_triton_stats(doc(30, 50_000_000, {1: 10, 4: 5}))
    split = split_between(before, after)
    assert split is not None and split.count == 20
    assert split.queue_us == pytest.approx(2000.0)
    assert split.compute_infer_us == pytest.approx(2000.0)
    assert batches_between(before, after) == {4: 5}
    assert parse_triton_stats({"error": "nope"}) is None
    assert split_between(None, after) is None
