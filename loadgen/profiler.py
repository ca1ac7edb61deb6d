"""``plaza profile``: a model's batch-latency curve, and dynamic_batching settings from it.

The backend runs directly (``plaza.workers.backends.create_backend``, ``load``, ``infer``), as a
worker runs it, with the worker's default intra-op threads (``WorkerSettings.intra_op_threads``
= 0: the config's ``intra_op_thread_count``, else every core) and no Kafka, Redis or HTTP,
over batch sizes 1, 2, 4, ... and max_batch_size. Rounds interleave the sizes (a noisy
machine drifts less within a round).

The recommendation, for a latency budget ``B`` (see docs/benchmarks.md):

- a request that arrives while the instance is busy waits for that batch, then for its own;
  with batches of ``n`` the worst case is about ``2 * L(n) + D`` (``D`` the queue delay);
- the candidates are the sizes with ``2 * L(n) <= B``; among them the preferred size is the
  smallest whose items/s is within 10% of the best candidate's (past the knee, bigger
  batches buy little throughput and cost latency);
- ``max_queue_delay_microseconds`` = ``min(B - 2 * L(n), L(n))``: the budget's slack, but no
  more than one batch time (while a batch runs the queue refills anyway).

Without a budget, ``B`` is unbounded: the knee of the curve, and a delay of one batch time.
A model that does not batch (``max_batch_size`` 0) runs each request alone: no preferred size
(a config refuses one past ``max_batch_size``, as Triton does) and no delay.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from plaza.loadgen import report_json
from plaza.loadgen.inputs import model_inputs
from plaza.loadgen.raw_backend import WORKER_DEFAULT_THREADS
from plaza.modelconfig import ModelSpec
from plaza.repository import ModelRepository
from plaza.samples.simulated import ensure_servable
from plaza.workers.backends import Backend, create_backend
from plaza.workers.device import select_device

KNEE_TOLERANCE = 0.10
DELAY_STEP_US = 100
UNBATCHED = (
    "max_batch_size 0, the model does not batch (a preferred size past max_batch_size is "
    "refused) and each request runs alone, so a queue delay would only add latency"
)


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """One batch size's latency (ms, over every timed call) and throughput."""

    batch_size: int
    p50_ms: float
    p90_ms: float
    mean_ms: float
    items_per_s: float
    calls: int


@dataclass(frozen=True, slots=True)
class Recommendation:
    preferred_batch_size: int | None
    """None: none (a model that does not batch takes no preferred size)."""
    max_queue_delay_us: int
    budget_ms: float | None
    worst_case_ms: float
    """2 * L(n) + D for the chosen n and D."""
    items_per_s: float
    note: str = ""

    def snippet(self) -> str:
        """The config.pbtxt dynamic_batching block."""
        if self.preferred_batch_size is None:
            preferred = (
                "  # no preferred_batch_size: max_batch_size is 0 (refused past it, as in\n"
                "  # Triton); each request runs alone, so no delay either\n"
            )
        else:
            preferred = f"  preferred_batch_size: [ {self.preferred_batch_size} ]\n"
        return (
            "dynamic_batching {\n"
            + preferred
            + f"  max_queue_delay_microseconds: {self.max_queue_delay_us}\n"
            "}"
        )


def profile_sizes(max_batch_size: int) -> list[int]:
    """1, 2, 4, ... up to max_batch_size, and max_batch_size itself."""
    top = max(1, max_batch_size)
    sizes = {1 << i for i in range(top.bit_length()) if 1 << i <= top}
    return sorted({*sizes, top})


def checked_sizes(sizes: Sequence[int] | None, max_batch_size: int) -> list[int]:
    """The batch sizes to profile: ``sizes`` (sorted, once each), every one in
    1..max_batch_size (ValueError otherwise), or ``profile_sizes`` when none are given."""
    top = max(1, max_batch_size)
    if not sizes:
        return profile_sizes(top)
    bad = sorted({n for n in sizes if not 1 <= n <= top})
    if bad:
        raise ValueError(f"batch sizes {bad} are outside 1..max_batch_size ({top})")
    return sorted(set(sizes))


def ensure_version_folder(repository: Path, model: str) -> None:
    """A plaza_simulated model has no file, but Triton's layout still wants ``<model>/1/``
    (the folder is git-ignored, so a fresh checkout lacks it): made here when missing."""
    ensure_servable(repository, model)


def measure_curve(
    backend: Backend,
    spec: ModelSpec,
    sizes: Sequence[int],
    *,
    seq_len: int = 16,
    rounds: int = 3,
    window_s: float = 0.5,
    min_calls: int = 3,
    seed: int = 0,
) -> list[CurvePoint]:
    """Time ``backend.infer`` per batch size: ``rounds`` windows each, interleaved."""
    if rounds < 1 or min_calls < 1 or not sizes or min(sizes) < 1:
        raise ValueError("need rounds >= 1, min_calls >= 1 and batch sizes >= 1")
    rng = np.random.default_rng(seed)
    outputs = [o.name for o in spec.outputs]
    feeds = {n: model_inputs(spec, n, seq_len, rng) for n in sizes}
    for n in sizes:  # warm-up: first calls allocate
        backend.infer(feeds[n], outputs)
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(rounds):
        for n in sizes:
            samples[n] += _window(backend, feeds[n], outputs, window_s, min_calls)
    return [_point(n, samples[n]) for n in sizes]


def _window(
    backend: Backend, feed: dict[str, Any], outputs: list[str], window_s: float, min_calls: int
) -> list[float]:
    times: list[float] = []
    end = time.perf_counter() + window_s
    while len(times) < min_calls or time.perf_counter() < end:
        t0 = time.perf_counter()
        backend.infer(feed, outputs)
        times.append(time.perf_counter() - t0)
    return times


def _point(n: int, seconds: list[float]) -> CurvePoint:
    ms = np.asarray(seconds) * 1e3
    p50, p90 = (float(v) for v in np.percentile(ms, [50, 90]))
    return CurvePoint(n, p50, p90, float(ms.mean()), n / (p50 / 1e3), len(seconds))


def fit_linear(curve: Sequence[CurvePoint]) -> tuple[float, float]:
    """Least-squares ``a * n + b`` (microseconds) through the p50 latencies."""
    if len(curve) < 2:
        p = curve[0]
        return p.p50_ms * 1e3 / p.batch_size, 0.0
    a, b = np.polyfit([p.batch_size for p in curve], [p.p50_ms * 1e3 for p in curve], 1)
    return float(a), float(b)


def recommend(
    curve: Sequence[CurvePoint],
    budget_ms: float | None = None,
    max_batch_size: int | None = None,
) -> Recommendation:
    """preferred_batch_size and max_queue_delay_microseconds (module docstring's rule), never
    above ``max_batch_size`` (a model's config refuses a preferred size past it, and any
    at all for a model that does not batch: ``max_batch_size`` 0)."""
    budget = float("inf") if budget_ms is None else budget_ms
    if max_batch_size is not None:
        curve = [p for p in curve if p.batch_size <= max(1, max_batch_size)]
    if not curve:
        raise ValueError("no batch size of the curve is within max_batch_size")
    if max_batch_size == 0:
        return _unbatched(curve, budget_ms)
    feasible = [p for p in curve if 2 * p.p50_ms <= budget]
    if not feasible:
        first = min(curve, key=lambda p: p.batch_size)
        return Recommendation(
            1,
            0,
            budget_ms,
            2 * first.p50_ms,
            first.items_per_s,
            note=f"the budget is below twice the batch-1 latency ({2 * first.p50_ms:.2f} ms): "
            "no batching setting meets it",
        )
    best = max(p.items_per_s for p in feasible)
    chosen = min(
        (p for p in feasible if p.items_per_s >= (1 - KNEE_TOLERANCE) * best),
        key=lambda p: p.batch_size,
    )
    slack_ms = min(budget - 2 * chosen.p50_ms, chosen.p50_ms)
    delay_us = int(slack_ms * 1e3) // DELAY_STEP_US * DELAY_STEP_US
    return Recommendation(
        chosen.batch_size,
        delay_us,
        budget_ms,
        2 * chosen.p50_ms + delay_us / 1e3,
        chosen.items_per_s,
    )


def _unbatched(curve: Sequence[CurvePoint], budget_ms: float | None) -> Recommendation:
    """A model that does not batch: no preferred size and no delay; one request at a time."""
    one = min(curve, key=lambda p: p.batch_size)
    note = UNBATCHED
    if budget_ms is not None and 2 * one.p50_ms > budget_ms:
        note += f"; the budget is below twice its latency ({2 * one.p50_ms:.2f} ms)"
    return Recommendation(None, 0, budget_ms, 2 * one.p50_ms, one.items_per_s, note=note)


@dataclass(frozen=True, slots=True)
class Profile:
    model: str
    version: int
    platform: str
    max_batch_size: int
    curve: list[CurvePoint]
    fit_a_us: float
    fit_b_us: float
    recommendation: Recommendation

    def as_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["recommendation"]["snippet"] = self.recommendation.snippet()
        return doc


def profile_model(
    repository: Path,
    model: str,
    *,
    budget_ms: float | None = None,
    sizes: Sequence[int] | None = None,
    threads: int = WORKER_DEFAULT_THREADS,
    device: Literal["auto", "cpu", "cuda"] = "auto",
    **timing: Any,
) -> Profile:
    """Load the latest served version of ``model`` and measure it; see ``measure_curve``."""
    ensure_version_folder(repository, model)
    mv = ModelRepository(repository).served_versions(model)[-1]
    spec = mv.spec
    chosen = checked_sizes(sizes, spec.max_batch_size)
    backend = create_backend(mv, select_device(device), threads)
    backend.load()
    try:
        curve = measure_curve(backend, spec, chosen, **timing)
    finally:
        backend.unload()
    a, b = fit_linear(curve)
    return Profile(
        model,
        mv.version,
        spec.platform,
        spec.max_batch_size,
        curve,
        a,
        b,
        recommend(curve, budget_ms, spec.max_batch_size),
    )


def write_profile(profile: Profile, out: Path) -> list[Path]:
    """``out``.json and ``out``.csv (the curve)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    json_path, csv_path = out.with_suffix(".json"), out.with_suffix(".csv")
    json_path.write_text(report_json.dumps(profile.as_dict()) + "\n", encoding="utf-8")
    fields = list(CurvePoint.__dataclass_fields__)
    lines = [",".join(fields)]
    lines += [",".join(str(getattr(p, f)) for f in fields) for p in profile.curve]
    csv_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return [json_path, csv_path]


def format_profile(profile: Profile) -> str:
    """The curve as a table, the recommendation and the snippet."""
    rec = profile.recommendation
    lines = [
        f"{profile.model} v{profile.version} ({profile.platform}), "
        f"max_batch_size {profile.max_batch_size}",
        f"  {'batch':>5}  {'p50 ms':>9}  {'p90 ms':>9}  {'items/s':>10}",
    ]
    lines += [
        f"  {p.batch_size:>5}  {p.p50_ms:>9.3f}  {p.p90_ms:>9.3f}  {p.items_per_s:>10.0f}"
        for p in profile.curve
    ]
    budget = "none" if rec.budget_ms is None else f"{rec.budget_ms:g} ms"
    lines += [
        f"  fit: {profile.fit_a_us:.1f} us/row * n + {profile.fit_b_us:.1f} us",
        f"latency budget {budget}: preferred_batch_size {rec.preferred_batch_size or 'none'}, "
        f"max_queue_delay_microseconds {rec.max_queue_delay_us} "
        f"(worst case ~{rec.worst_case_ms:.2f} ms, ~{rec.items_per_s:.0f} items/s)",
    ]
    if rec.note:
        lines.append(f"note: {rec.note}")
    lines.append(rec.snippet())
    return "\n".join(lines)
