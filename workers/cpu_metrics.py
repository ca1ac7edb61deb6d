"""The host's CPU metrics, Triton's names: utilisation and memory, from Linux's ``/proc``.

A collector for a worker's registry. ``nv_cpu_utilization`` is the share of the machine's
CPU time that was busy (everything but idle and I/O wait) since the previous scrape, or
since the collector was made for the first; ``nv_cpu_memory_used_bytes`` is the memory not
available to new work (``MemTotal - MemAvailable``). Where ``/proc`` cannot be read (not
Linux) it yields nothing, as the GPU collector does without a GPU.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from plaza.naming import METRIC_CPU_MEMORY_TOTAL, METRIC_CPU_MEMORY_USED, METRIC_CPU_UTILIZATION

log = logging.getLogger(__name__)

CpuTimes = tuple[int, int]
"""(busy, total) CPU time of the whole machine, in clock ticks."""


def cpu_times(stat: str) -> CpuTimes:
    """Busy and total time from ``/proc/stat``'s text: its ``cpu`` line's user, nice,
    system, idle, iowait, irq, softirq and steal (guest time is counted in user)."""
    fields = stat.split("\n", 1)[0].split()
    if not fields or fields[0] != "cpu":
        raise ValueError("/proc/stat does not start with the 'cpu' line")
    ticks = [int(v) for v in fields[1:9]]
    idle = ticks[3] + ticks[4]
    return sum(ticks) - idle, sum(ticks)


def memory_bytes(meminfo: str) -> tuple[int, int]:
    """(used, total) bytes from ``/proc/meminfo``'s text: MemTotal less MemAvailable."""
    kib = {}
    for line in meminfo.splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            kib[key] = int(rest.split()[0])
    total = kib["MemTotal"] * 1024
    return total - kib["MemAvailable"] * 1024, total


class CpuCollector:
    """``nv_cpu_utilization`` (0.0-1.0), ``nv_cpu_memory_used_bytes``, ``..._total_bytes``."""

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = proc
        self._lock = threading.Lock()
        self._last = self._times()

    def _times(self) -> CpuTimes | None:
        try:
            return cpu_times((self._proc / "stat").read_text())
        except (OSError, ValueError, IndexError) as exc:
            log.debug("no CPU metrics: %s", exc)
            return None

    def _utilization(self) -> float | None:
        now = self._times()
        with self._lock:
            last, self._last = self._last, now
        if now is None or last is None or now[1] <= last[1]:
            return None
        return (now[0] - last[0]) / (now[1] - last[1])

    def collect(self) -> Iterator[Metric]:
        rate = self._utilization()
        if rate is not None:
            util = GaugeMetricFamily(
                METRIC_CPU_UTILIZATION, "CPU utilization rate [0.0 - 1.0] since the last scrape"
            )
            util.add_metric([], rate)
            yield util
        try:
            used, total = memory_bytes((self._proc / "meminfo").read_text())
        except (OSError, ValueError, KeyError, IndexError) as exc:
            log.debug("no CPU memory metrics: %s", exc)
            return
        yield GaugeMetricFamily(
            METRIC_CPU_MEMORY_USED, "CPU used memory (RAM, not available), in bytes", value=used
        )
        yield GaugeMetricFamily(
            METRIC_CPU_MEMORY_TOTAL, "CPU total memory (RAM), in bytes", value=total
        )
