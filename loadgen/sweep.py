"""Sweeps: several load points on one or more targets, and their CSV / JSON / PNG reports.

Targets are measured side by side: for each load point every target runs in turn before
the next point, so a slow drift of a shared machine touches them alike.
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from plaza.loadgen import report_json
from plaza.loadgen.measure import Load, PointResult, WindowConfig, WindowResult, measure
from plaza.loadgen.targets import Target

Progress = Callable[[str, WindowResult], None]
MAX_POINTS = 1000
"""The most values a range may give (a typo such as ``1:1e9`` must not run for ever)."""


class SweepError(RuntimeError):
    """A load point failed; the sweep stopped there. ``points`` are those measured before
    it, for the caller to report and write (nothing measured is lost)."""

    def __init__(
        self, label: str, cause: Exception, points: list[PointResult], *, started: bool = True
    ) -> None:
        super().__init__(f"{label}: {cause}")
        self.label = label
        self.cause = cause
        self.points = points
        self.started = started
        """False: a target did not start (``label`` names it), nothing was measured."""


def parse_range(text: str) -> list[float]:
    """``"1:64:x2"`` (geometric), ``"100:400:100"`` (arithmetic), ``"1,4,16"`` or ``"16"``.
    Every value is a finite number > 0 (ValueError otherwise), checked before any runs."""
    values = _range_values(text.strip())
    bad = [v for v in values if not 0 < v < math.inf]
    if bad or not values:
        raise ValueError(f"bad range {text!r}: every value must be a number > 0")
    return values


def _range_values(text: str) -> list[float]:
    if "," in text:
        return [_number(v, text) for v in text.split(",") if v.strip()]
    parts = text.split(":")
    if len(parts) == 1:
        return [_number(parts[0], text)]
    if len(parts) not in (2, 3):
        raise ValueError(f"bad range {text!r}: start:end[:step] (step N or xN)")
    start, end = _number(parts[0], text), _number(parts[1], text)
    step = parts[2] if len(parts) == 3 else "1"
    if not 0 < start <= end < math.inf:
        raise ValueError(f"bad range {text!r}: need 0 < start <= end")
    values: list[float] = []
    value = start
    if step.startswith("x"):
        factor = _number(step[1:], text)
        if factor <= 1:
            raise ValueError(f"bad range {text!r}: the factor must be > 1")
        while value <= end * (1 + 1e-9):
            values.append(_counted(values, value, text))
            value *= factor
    else:
        inc = _number(step, text)
        if inc <= 0:
            raise ValueError(f"bad range {text!r}: the step must be > 0")
        while value <= end * (1 + 1e-9):
            values.append(_counted(values, value, text))
            value += inc
    return values


def _number(item: str, text: str) -> float:
    try:
        return float(item)
    except ValueError:
        raise ValueError(f"bad range {text!r}: {item.strip()!r} is not a number") from None


def _counted(values: list[float], value: float, text: str) -> float:
    if len(values) >= MAX_POINTS:
        raise ValueError(f"bad range {text!r}: more than {MAX_POINTS} values")
    return value


async def run_sweep(
    targets: Sequence[Target],
    loads: Sequence[Load],
    cfg: WindowConfig,
    progress: Progress | None = None,
) -> list[PointResult]:
    """Every load on every target, targets interleaved per load. Targets are started here,
    and every one started is stopped at the end, however it ends. A target that does not
    start, or a point that fails, stops the sweep with SweepError, which carries the points
    before it."""
    results: list[PointResult] = []
    async with contextlib.AsyncExitStack() as started:
        for target in targets:
            try:
                await target.start()
            except Exception as exc:
                raise SweepError(target.label, exc, results, started=False) from exc
            started.push_async_callback(target.stop)
        for load in loads:
            for target in targets:
                label = f"{target.label} {load.label}"
                hook = None if progress is None else (lambda w, lb=label: progress(lb, w))
                try:
                    results.append(await measure(target, load, cfg, hook))
                except Exception as exc:
                    raise SweepError(label, exc, results) from exc
    return results


def format_table(points: Sequence[PointResult]) -> str:
    head = (
        f"{'target':<12} {'load':<26} {'infer/s':>9} {'p50':>8} {'p90':>8} {'p95':>8} "
        f"{'p99':>8} {'queue':>8} {'infer':>8} {'other':>8} {'batch':>6} {'err':>5} "
        f"{'sent/s':>9} {'late':>6} stable"
    )
    lines = [
        head,
        "  (latencies in ms, from each actual send; queue / infer = server-side means; "
        "other = the rest;",
        "   sent/s = sends achieved, late = sends > 1 ms behind a rate's schedule: a rate "
        "point with late sends did not offer its rate)",
    ]
    for p in points:
        s = p.server
        queue = s.queue_us / 1e3 if s else math.nan
        infer = s.compute_infer_us / 1e3 if s else math.nan
        other = p.client_overhead_us / 1e3
        lat = p.latency
        late = str(p.late_sends) if p.load.mode == "rate" else "-"
        lines.append(
            f"{p.target:<12} {p.load.label:<26} {p.throughput:>9.1f} {lat.p50_ms:>8.2f} "
            f"{lat.p90_ms:>8.2f} {lat.p95_ms:>8.2f} {lat.p99_ms:>8.2f} {queue:>8.2f} "
            f"{infer:>8.2f} {other:>8.2f} {p.mean_batch:>6.1f} {p.errors:>5} "
            f"{p.send_rate:>9.1f} {late:>6} {'yes' if p.stable else 'no'}"
        )
    return "\n".join(lines)


def environment() -> dict[str, Any]:
    import os

    return {
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def prepare_out(out: Path) -> None:
    """Make the folder of ``out`` (a report's path less its suffix) and check that it takes
    files, before any work is done: ValueError in one line. A run that measured for minutes
    must not lose its results to a path it could never write."""
    folder = out.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file in the way, no permission, a read-only disk
        reason = exc.strerror or type(exc).__name__
        raise ValueError(f"--out {out}: cannot make the folder {folder}: {reason}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out}: the folder {folder} is not writable")


def write_reports(
    points: Sequence[PointResult], out: Path, meta: dict[str, Any], *, plot: bool = True
) -> list[Path]:
    """``out``.csv, ``out``.json and (``plot``) ``out``.png; the paths written."""
    out.parent.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out.with_suffix(".csv"), out.with_suffix(".json")
    rows = [p.as_row() for p in points]
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["target"])
        writer.writeheader()
        writer.writerows(rows)
    doc = {"meta": {**meta, "environment": environment()}, "points": [p.as_dict() for p in points]}
    json_path.write_text(report_json.dumps(doc) + "\n", encoding="utf-8")
    written = [csv_path, json_path]
    if plot and points:
        from plaza.loadgen.plots import latency_vs_throughput

        curves: dict[str, list[tuple[float, float, float]]] = {}
        for p in points:
            key = f"{p.target} {p.load.mode}"
            curves.setdefault(key, []).append((p.throughput, p.latency.p50_ms, p.latency.p99_ms))
        title = f"{meta.get('model', '')}: latency vs throughput"
        try:
            written.append(latency_vs_throughput(curves, out.with_suffix(".png"), title))
        except ImportError:
            print("note: matplotlib is not installed; no plot", file=sys.stderr)
    return written
