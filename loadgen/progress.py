"""A progress bar over measurement windows: tqdm when installed and stderr is a terminal."""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Any

from plaza.loadgen.measure import WindowResult


class WindowProgress:
    """Counts windows (``total`` at most); shows the last window's throughput and p99."""

    def __init__(self, total: int, enabled: bool | None = None) -> None:
        show = sys.stderr.isatty() if enabled is None else enabled
        self._bar: Any = None
        if show:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self._bar = tqdm(total=total, unit="window", dynamic_ncols=True, leave=False)

    def __call__(self, label: str, window: WindowResult) -> None:
        if self._bar is None:
            return
        self._bar.set_description(label, refresh=False)
        self._bar.set_postfix_str(
            f"{window.throughput:.0f}/s p99 {window.latency.p99_ms:.1f} ms", refresh=False
        )
        self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> WindowProgress:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
