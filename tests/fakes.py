"""Fakes for pure-logic tests (no services): a clock the test moves by hand."""

from __future__ import annotations


class ManualClock:
    """A monotonic clock that stands still until the test sets ``now``."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
