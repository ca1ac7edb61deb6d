"""Arrival processes: when requests arrive, as offsets in seconds from the start.

The load generator's request-rate mode and the simulator draw from the same processes, so
a simulated run and a real one can be offered the very same arrival times (same seed).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np

Distribution = Literal["constant", "poisson", "bursts"]
DISTRIBUTIONS: tuple[Distribution, ...] = ("constant", "poisson", "bursts")


@dataclass(frozen=True, slots=True)
class ArrivalProcess:
    """``rate`` requests per second on average.

    - constant: exactly 1/rate apart;
    - poisson: exponential gaps of mean 1/rate (seeded);
    - bursts: ``burst_size`` requests at once, bursts ``burst_size / rate`` apart.
    """

    rate: float
    distribution: Distribution = "constant"
    burst_size: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ValueError(f"rate must be positive, got {self.rate}")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"unknown distribution {self.distribution!r} ({DISTRIBUTIONS})")
        if self.burst_size < 1:
            raise ValueError("burst_size must be >= 1")

    def times(self, until_s: float, limit: int | None = None) -> Iterator[float]:
        """Arrival offsets in [0, until_s), at most ``limit`` of them, in order."""
        for count, t in enumerate(self._unbounded()):
            if t >= until_s or (limit is not None and count >= limit):
                return
            yield t

    def _unbounded(self) -> Iterator[float]:
        if self.distribution == "constant":
            i = 0
            while True:
                yield i / self.rate
                i += 1
        elif self.distribution == "poisson":
            rng = np.random.default_rng(self.seed)
            t = 0.0
            while True:
                for gap in rng.exponential(1.0 / self.rate, 1024):
                    yield t
                    t += float(gap)
        else:
            period = self.burst_size / self.rate
            k = 0
            while True:
                for _ in range(self.burst_size):
                    yield k * period
                k += 1
