"""A process's CPU by thread between two moments: which thread of a worker or a gateway
spends what, per request and per batch.

    python scripts/thread_cpu.py snap PID > before.json      # ... load ...
    python scripts/thread_cpu.py snap PID > after.json
    python scripts/thread_cpu.py diff before.json after.json REQUESTS [BATCHES]

``snap`` reads each thread's user and system time from ``/proc/PID/task/*/stat`` (clock
ticks); ``diff`` prints, for every thread that ran in between, its name (``comm``: the
event loop's thread is the process's own name, the executor's ``infer-MODEL-...``, ONNX
Runtime's pool threads carry the interpreter's name too), its CPU in ms, and that CPU per
request and per batch. ``scripts/profile_stack.sh`` runs both around its measured window.
Linux only.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def snap(pid: int) -> dict[str, tuple[str, int, int]]:
    """Each live thread of ``pid``: (name, user ticks, system ticks)."""
    threads: dict[str, tuple[str, int, int]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:  # the thread ended meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        threads[tid] = (name, int(fields[11]), int(fields[12]))  # utime, stime
    return threads


def diff(
    before: dict[str, list[Any]], after: dict[str, list[Any]], requests: int, batches: int
) -> list[str]:
    """One line per thread that ran between the snapshots, most CPU first, and a total."""
    rows = []
    for tid, (name, user, system) in after.items():
        _, user0, system0 = before.get(tid, (name, 0, 0))
        du, ds = user - user0, system - system0
        if du + ds:
            rows.append((du + ds, tid, name, du, ds))
    lines = []
    total_s = 0.0
    for ticks, tid, name, du, ds in sorted(rows, reverse=True):
        cpu_s = ticks * TICK_S
        total_s += cpu_s
        per_batch = f"  {cpu_s * 1e6 / batches:8.1f} us/batch" if batches else ""
        lines.append(
            f"thread {tid:>8} {name:<18} {cpu_s * 1e3:7.0f} ms (user {du * TICK_S * 1e3:.0f},"
            f" sys {ds * TICK_S * 1e3:.0f})  {cpu_s * 1e6 / max(requests, 1):7.1f} us/request"
            + per_batch
        )
    lines.append(f"threads total {total_s * 1e3:.0f} ms")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "snap":
        json.dump(snap(int(argv[1])), sys.stdout)
        return 0
    if len(argv) >= 4 and argv[0] == "diff":
        with open(argv[1]) as f:
            before = json.load(f)
        with open(argv[2]) as f:
            after = json.load(f)
        batches = int(argv[4]) if len(argv) > 4 else 0
        print("\n".join(diff(before, after, int(argv[3]), batches)))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
