"""plaza profile: the batch-latency curve and the dynamic_batching recommendation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from plaza.loadgen.latency import ProfileLatency
from plaza.loadgen.profiler import (
    CurvePoint,
    ensure_version_folder,
    fit_linear,
    profile_model,
    profile_sizes,
    recommend,
    write_profile,
)
from plaza.modelconfig import parse_model_config

ROOT = Path(__file__).resolve().parents[2]


def curve(latencies_ms: dict[int, float]) -> list[CurvePoint]:
    return [CurvePoint(n, ms, ms, ms, n / (ms / 1e3), 10) for n, ms in latencies_ms.items()]


# a*n+b with b = 10 ms, a = 1 ms: throughput keeps rising, with diminishing returns
LINEAR = curve({n: 10.0 + n for n in (1, 2, 4, 8, 16, 32, 64)})


def test_profile_sizes_are_powers_of_two_and_the_max() -> None:
    assert profile_sizes(64) == [1, 2, 4, 8, 16, 32, 64]
    assert profile_sizes(48) == [1, 2, 4, 8, 16, 32, 48]
    assert profile_sizes(1) == [1]
    assert profile_sizes(0) == [1]


def test_budget_limits_the_batch_size() -> None:
    rec = recommend(LINEAR, budget_ms=60)  # 2 * L(n) <= 60 -> n <= 20 -> 16
    assert rec.preferred_batch_size == 16
    assert rec.max_queue_delay_us == 8000  # min(60 - 2 * 26, 26) ms
    assert rec.worst_case_ms <= 60


def test_delay_is_the_slack_but_at_most_one_batch_time() -> None:
    rec = recommend(LINEAR, budget_ms=100)  # n = 32: L = 42, slack 16 ms < 42
    assert rec.preferred_batch_size == 32
    assert rec.max_queue_delay_us == 16_000
    roomy = recommend(LINEAR, budget_ms=10_000)
    assert roomy.max_queue_delay_us == 74_000  # capped at L(64)


def test_no_budget_picks_the_knee() -> None:
    flat = curve({1: 1.0, 2: 1.1, 4: 1.2, 8: 2.4, 16: 4.6, 32: 9.0})  # saturates from 4 on
    rec = recommend(flat)
    best = max(p.items_per_s for p in flat)
    chosen = next(p for p in flat if p.batch_size == rec.preferred_batch_size)
    assert chosen.items_per_s >= 0.9 * best
    assert rec.preferred_batch_size == 4


def test_impossible_budget_says_so() -> None:
    rec = recommend(LINEAR, budget_ms=5)
    assert (rec.preferred_batch_size, rec.max_queue_delay_us) == (1, 0)
    assert "budget" in rec.note


def test_snippet_is_valid_config() -> None:
    rec = recommend(LINEAR, budget_ms=60)
    text = (
        'platform: "onnxruntime_onnx"\nmax_batch_size: 64\n'
        'input [{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }]\n'
        'output [{ name: "y" data_type: TYPE_FP32 dims: [ 4 ] }]\n' + rec.snippet()
    )
    spec = parse_model_config(text, source="m/config.pbtxt", default_name="m")
    assert spec.batching.preferred_batch_sizes == (rec.preferred_batch_size,)
    assert spec.batching.max_queue_delay_us == rec.max_queue_delay_us


def test_fit_recovers_a_linear_curve() -> None:
    a, b = fit_linear(LINEAR)
    assert a == pytest.approx(1000.0) and b == pytest.approx(10_000.0)


def test_profile_runs_the_simulated_backend(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "simulated").mkdir(parents=True)
    config = (ROOT / "model_repository" / "simulated" / "config.pbtxt").read_text()
    config = config.replace('"1000"', '"20"').replace('"15000"', '"200"')  # fast sleeps
    (repo / "simulated" / "config.pbtxt").write_text(config)
    ensure_version_folder(repo, "simulated")
    assert (repo / "simulated" / "1").is_dir()
    prof = profile_model(
        repo, "simulated", budget_ms=50, device="cpu", rounds=1, window_s=0.01, min_calls=2
    )
    assert [p.batch_size for p in prof.curve] == profile_sizes(prof.max_batch_size)
    assert all(p.p50_ms >= 0.2 for p in prof.curve)
    paths = write_profile(prof, tmp_path / "out" / "simulated")
    assert {p.suffix for p in paths} == {".json", ".csv"}
    doc = json.loads(paths[0].read_text())
    assert "dynamic_batching" in doc["recommendation"]["snippet"]
    assert ProfileLatency.from_file(paths[0]).batch_latency_s(1) > 0


def test_profile_of_an_onnx_model(tmp_path: Path) -> None:
    source = ROOT / "model_repository" / "identity"
    if not (source / "1" / "model.onnx").is_file():
        pytest.skip("identity is not built (make models)")
    shutil.copytree(source, tmp_path / "identity")
    prof = profile_model(
        tmp_path, "identity", sizes=[1, 4], device="cpu", threads=1, rounds=1, window_s=0.01
    )
    assert [p.batch_size for p in prof.curve] == [1, 4]


def test_version_folder_is_made_for_simulated_models_only(tmp_path: Path) -> None:
    shutil.copytree(
        ROOT / "model_repository" / "identity",
        tmp_path / "identity",
        ignore=lambda _, names: [n for n in names if n.isdigit()],
    )
    ensure_version_folder(tmp_path, "identity")
    ensure_version_folder(tmp_path, "absent")
    assert not (tmp_path / "identity" / "1").exists() and not (tmp_path / "absent").exists()


def test_a_model_that_does_not_batch_gets_no_preferred_size() -> None:
    """max_batch_size 0: a preferred size of 1 is past it, and the config refuses it (as
    Triton does); the snippet names none, and no delay, and loads."""
    rec = recommend(curve({1: 2.0}), budget_ms=10, max_batch_size=0)
    assert (rec.preferred_batch_size, rec.max_queue_delay_us) == (None, 0)
    assert "does not batch" in rec.note and "preferred_batch_size" in rec.snippet()
    text = (
        'platform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        'input [{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }]\n'
        'output [{ name: "y" data_type: TYPE_FP32 dims: [ 4 ] }]\n' + rec.snippet()
    )
    spec = parse_model_config(text, source="m/config.pbtxt", default_name="m")
    assert spec.batching.enabled and spec.batching.preferred_batch_sizes == ()
    assert spec.batching.max_queue_delay_us == 0
