"""Split a worker's CPU into a cost per batch and a cost per request, by least squares.

    python scripts/batch_cost_fit.py identity kafka 8 32 64 128

Runs ``scripts/profile_stack.sh MODEL TARGET C`` once per concurrency (on a Kafka and Redis
that already run, as that script says) and fits, over the runs, the worker's CPU as
``a * batches + b * requests``: ``a`` is what a batch costs whatever its size (the fetch,
the Redis round trips, the run's hand-offs) and ``b`` what each request adds, so ``b`` is
the floor of the worker's CPU per request however large its batches grow.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np

_LINE = re.compile(r"requests (\d+) batches (\d+) worker_cpu_ms (\d+)")


def measure(model: str, target: str, concurrency: int) -> tuple[int, int, float]:
    """(requests, batches, worker CPU seconds) of one ``profile_stack.sh`` run."""
    script = Path(__file__).with_name("profile_stack.sh")
    out = subprocess.run(
        [str(script), model, target, str(concurrency)], capture_output=True, text=True, check=True
    ).stdout
    found = _LINE.search(out)
    if found is None:
        raise SystemExit(f"no CPU line in profile_stack.sh's output:\n{out}")
    requests, batches, cpu_ms = (int(g) for g in found.groups())
    return requests, batches, cpu_ms / 1000


def main(argv: list[str]) -> None:
    if len(argv) < 4:
        raise SystemExit(__doc__)
    model, target, levels = argv[0], argv[1], [int(c) for c in argv[2:]]
    rows = []
    for c in levels:
        requests, batches, cpu_s = measure(model, target, c)
        rows.append((requests, batches, cpu_s))
        print(
            f"c={c:<4} requests {requests:>6} batches {batches:>5} "
            f"({requests / max(batches, 1):5.1f} per batch) worker CPU {cpu_s:.2f} s "
            f"({cpu_s / max(requests, 1) * 1e6:.0f} us/request)"
        )
    x = np.array([[b, n] for n, b, _ in rows], dtype=float)
    y = np.array([cpu for _, _, cpu in rows])
    (per_batch, per_request), *_ = np.linalg.lstsq(x, y, rcond=None)
    fitted = x @ np.array([per_batch, per_request])
    worst = max(abs(f - v) / v for f, v in zip(fitted, y, strict=True))
    print(
        f"fit: {per_batch * 1e6:.0f} us per batch + {per_request * 1e6:.1f} us per request "
        f"(worst run off the fit by {worst:.0%})"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
