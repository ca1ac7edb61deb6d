"""PNG plots (matplotlib, Agg backend: no display needed). matplotlib is imported lazily."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

Curve = Sequence[tuple[float, float, float]]
"""(throughput, p50 ms, p99 ms) points of one configuration."""


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def latency_vs_throughput(curves: Mapping[str, Curve], path: Path, title: str) -> Path:
    """p50 (solid) and p99 (dashed) latency against throughput, one colour per config."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (label, points) in enumerate(curves.items()):
        pts = sorted(points)
        colour = f"C{i % 10}"
        xs = [p[0] for p in pts]
        ax.plot(xs, [p[1] for p in pts], "o-", color=colour, label=f"{label} p50")
        ax.plot(xs, [p[2] for p in pts], "s--", color=colour, alpha=0.7, label=f"{label} p99")
    ax.set_xlabel("throughput (infer/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def simulation(
    depth: Sequence[tuple[float, int]], batch_sizes: Mapping[int, int], path: Path, title: str
) -> Path:
    """Queue depth over time (left) and the batch-size distribution (right)."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    left.step([t for t, _ in depth], [d for _, d in depth], where="post")
    left.set_xlabel("time (s)")
    left.set_ylabel("requests waiting")
    left.set_title("queue depth")
    left.grid(True, alpha=0.3)
    sizes = sorted(batch_sizes)
    right.bar(sizes, [batch_sizes[s] for s in sizes], width=0.8)
    right.set_xlabel("batch size (rows)")
    right.set_ylabel("batches")
    right.set_title("batch sizes")
    fig.suptitle(title)
    return _save(fig, path)


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
