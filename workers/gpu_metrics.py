"""GPU metrics from pynvml, Triton's names: utilisation and memory of every visible GPU.

A collector for a worker's registry. Without pynvml, without a driver or without a GPU it
yields nothing (the metrics are absent, as on a Triton server without GPUs); a GPU that
stops answering mid-scrape drops the GPU metrics from that scrape, never the scrape.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from plaza.naming import (
    LABEL_GPU_UUID,
    METRIC_GPU_MEMORY_TOTAL,
    METRIC_GPU_MEMORY_USED,
    METRIC_GPU_UTILIZATION,
)

log = logging.getLogger(__name__)


def _load_pynvml() -> Any:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


class GpuCollector:
    """``nv_gpu_utilization`` (0.0-1.0), ``nv_gpu_memory_used_bytes``, ``..._total_bytes``.

    ``nvml`` is the pynvml module (or a stand-in with its functions, for tests); NVML is
    initialised on the first scrape, once, and shut down by ``close``.
    """

    def __init__(self, nvml: Any | None = None) -> None:
        self._nvml = nvml if nvml is not None else _load_pynvml()
        self._state: bool | None = None
        """None: not tried yet; True: NVML is initialised; False: no NVML here."""
        self._lock = threading.Lock()

    def _ready(self) -> bool:
        with self._lock:
            if self._state is None:
                self._state = self._init()
            return self._state

    def _init(self) -> bool:
        if self._nvml is None:
            return False
        try:
            self._nvml.nvmlInit()
        except Exception as exc:  # NVMLError: no driver, no library
            log.debug("no GPU metrics: NVML did not initialise: %s", exc)
            return False
        return True

    def _readings(self) -> list[tuple[str, float, int, int]]:
        nvml = self._nvml
        assert nvml is not None
        readings = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            util = nvml.nvmlDeviceGetUtilizationRates(handle)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            readings.append((uuid, float(util.gpu) / 100.0, int(mem.used), int(mem.total)))
        return readings

    def collect(self) -> Iterator[Metric]:
        if not self._ready():
            return
        try:
            readings = self._readings()
        except Exception as exc:  # a GPU fell off the bus, the driver went away
            log.warning("reading GPU metrics failed: %s", exc)
            return
        if not readings:
            return
        util = GaugeMetricFamily(
            METRIC_GPU_UTILIZATION, "GPU utilization rate [0.0 - 1.0)", labels=[LABEL_GPU_UUID]
        )
        used = GaugeMetricFamily(
            METRIC_GPU_MEMORY_USED, "GPU used memory, in bytes", labels=[LABEL_GPU_UUID]
        )
        total = GaugeMetricFamily(
            METRIC_GPU_MEMORY_TOTAL, "GPU total memory, in bytes", labels=[LABEL_GPU_UUID]
        )
        for uuid, rate, used_bytes, total_bytes in readings:
            util.add_metric([uuid], rate)
            used.add_metric([uuid], used_bytes)
            total.add_metric([uuid], total_bytes)
        yield from (util, used, total)

    def close(self) -> None:
        """Shut NVML down if a scrape started it."""
        with self._lock:
            if self._state:
                try:
                    self._nvml.nvmlShutdown()
                except Exception as exc:
                    log.debug("nvmlShutdown failed: %s", exc)
            self._state = None
