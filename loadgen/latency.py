"""Batch latency models for the simulator: ``a * n + b``, or a measured profile.

A profile is what ``plaza profile`` writes (``plaza.loadgen.profiler``): batch latencies at some
batch sizes; sizes in between are interpolated linearly, sizes past the ends extrapolated
along the nearest segment (never below zero).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from plaza.errors import ConfigError
from plaza.modelconfig import BACKEND_SIMULATED, ModelSpec


class LatencyModel(Protocol):
    """Seconds one instance takes to run a batch of ``rows`` rows."""

    def batch_latency_s(self, rows: int) -> float: ...

    def describe(self) -> str: ...


@dataclass(frozen=True, slots=True)
class LinearLatency:
    """``a_us`` per row plus ``b_us`` per batch (the simulated device's own model)."""

    a_us: float
    b_us: float

    def __post_init__(self) -> None:
        if not (0 <= self.a_us < float("inf") and 0 <= self.b_us < float("inf")):
            raise ValueError(f"latency a and b must be >= 0, got a={self.a_us}, b={self.b_us}")

    def batch_latency_s(self, rows: int) -> float:
        return (self.a_us * rows + self.b_us) / 1e6

    def describe(self) -> str:
        return f"linear a={self.a_us:g}us/row b={self.b_us:g}us/batch"

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> LinearLatency:
        """The ``latency_a_us`` / ``latency_b_us`` parameters of a plaza_simulated model."""
        if spec.platform != BACKEND_SIMULATED:
            raise ConfigError(
                f"{spec.name}: not a plaza_simulated model; give a profile (--profile) "
                "or --latency-a-us/--latency-b-us"
            )
        try:
            return cls(
                float(spec.parameters.get("latency_a_us", "0")),
                float(spec.parameters.get("latency_b_us", "0")),
            )
        except ValueError:
            raise ConfigError(
                f"{spec.name}: latency_a_us / latency_b_us must be numbers >= 0"
            ) from None


@dataclass(frozen=True, slots=True)
class ProfileLatency:
    """Piecewise-linear through measured (batch size, seconds) points."""

    sizes: tuple[int, ...]
    seconds: tuple[float, ...]
    source: str = ""

    def __post_init__(self) -> None:
        if not self.sizes or len(self.sizes) != len(self.seconds):
            raise ValueError("a profile needs matching, non-empty sizes and latencies")

    def batch_latency_s(self, rows: int) -> float:
        xs, ys = self.sizes, self.seconds
        if len(xs) == 1:
            return ys[0] * rows / xs[0]
        if rows <= xs[0]:
            lo, hi = 0, 1
        elif rows >= xs[-1]:
            lo, hi = len(xs) - 2, len(xs) - 1
        else:
            return float(np.interp(rows, xs, ys))
        slope = (ys[hi] - ys[lo]) / (xs[hi] - xs[lo])
        return max(0.0, ys[lo] + slope * (rows - xs[lo]))

    def describe(self) -> str:
        return f"profile {self.source or '(inline)'} over batch sizes {list(self.sizes)}"

    @classmethod
    def from_points(cls, points: Mapping[int, float], source: str = "") -> ProfileLatency:
        ordered = sorted(points.items())
        return cls(tuple(k for k, _ in ordered), tuple(v for _, v in ordered), source)

    @classmethod
    def from_file(cls, path: Path, statistic: str = "p50_ms") -> ProfileLatency:
        """Read a ``plaza profile`` JSON file (its ``curve``: batch_size + latency in ms)."""
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            curve: Sequence[Mapping[str, float]] = doc["curve"]
            points = {int(p["batch_size"]): float(p[statistic]) / 1e3 for p in curve}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path}: not a profile written by `plaza profile`: {exc}") from exc
        return cls.from_points(points, str(path))
