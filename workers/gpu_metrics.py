"""GPU metrics from pynvml, Triton's names: utilisation, memory, power and energy of every
visible GPU.

A collector for a worker's registry. Without pynvml, without a driver or without a GPU it
yields nothing (the metrics are absent, as on a Triton server without GPUs); a GPU that
stops answering mid-scrape drops the GPU metrics from that scrape, never the scrape. A GPU
that cannot report its power (NVML's "not supported") lacks only the power metrics.
``nv_energy_consumption`` counts the joules each GPU used since the collector first read
it (Triton: since the server started).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from plaza.naming import (
    LABEL_GPU_UUID,
    METRIC_GPU_ENERGY,
    METRIC_GPU_MEMORY_TOTAL,
    METRIC_GPU_MEMORY_USED,
    METRIC_GPU_POWER_LIMIT,
    METRIC_GPU_POWER_USAGE,
    METRIC_GPU_UTILIZATION,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one scrape; the power figures are None where it cannot report them."""

    uuid: str
    utilization: float
    used_bytes: int
    total_bytes: int
    power_w: float | None = None
    power_limit_w: float | None = None
    energy_mj: int | None = None
    """NVML's energy counter, millijoules since the driver loaded."""


def _optional(nvml: Any, function: str, handle: Any) -> Any:
    """NVML's ``function(handle)``, or None where the GPU (or the library) lacks it."""
    try:
        return getattr(nvml, function)(handle)
    except Exception as exc:  # NVMLError_NotSupported, and the like
        log.debug("a GPU metric is not available: %s", exc)
        return None


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
        self._energy_base: dict[str, int] = {}
        """Each GPU's energy counter when first read: the zero of its consumption."""

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

    def _readings(self) -> list[GpuReading]:
        nvml = self._nvml
        assert nvml is not None
        readings = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            util = nvml.nvmlDeviceGetUtilizationRates(handle)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            power = _optional(nvml, "nvmlDeviceGetPowerUsage", handle)
            limit = _optional(nvml, "nvmlDeviceGetPowerManagementLimit", handle)
            energy = _optional(nvml, "nvmlDeviceGetTotalEnergyConsumption", handle)
            readings.append(
                GpuReading(
                    uuid,
                    float(util.gpu) / 100.0,
                    int(mem.used),
                    int(mem.total),
                    None if power is None else power / 1000.0,  # NVML: milliwatts
                    None if limit is None else limit / 1000.0,
                    None if energy is None else int(energy),
                )
            )
        return readings

    def _joules(self, reading: GpuReading) -> float | None:
        if reading.energy_mj is None:
            return None
        with self._lock:
            base = self._energy_base.setdefault(reading.uuid, reading.energy_mj)
        return max(0, reading.energy_mj - base) / 1000.0

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
        power = GaugeMetricFamily(
            METRIC_GPU_POWER_USAGE, "GPU power usage, in watts", labels=[LABEL_GPU_UUID]
        )
        limit = GaugeMetricFamily(
            METRIC_GPU_POWER_LIMIT, "GPU power management limit, in watts", labels=[LABEL_GPU_UUID]
        )
        energy = CounterMetricFamily(
            METRIC_GPU_ENERGY,
            "GPU energy used since this process first read it, in joules",
            labels=[LABEL_GPU_UUID],
        )
        for r in readings:
            util.add_metric([r.uuid], r.utilization)
            used.add_metric([r.uuid], r.used_bytes)
            total.add_metric([r.uuid], r.total_bytes)
            if r.power_w is not None:
                power.add_metric([r.uuid], r.power_w)
            if r.power_limit_w is not None:
                limit.add_metric([r.uuid], r.power_limit_w)
            joules = self._joules(r)
            if joules is not None:
                energy.add_metric([r.uuid], joules)
        yield from (util, used, total)
        yield from (family for family in (power, limit, energy) if family.samples)

    def close(self) -> None:
        """Shut NVML down if a scrape started it."""
        with self._lock:
            if self._state:
                try:
                    self._nvml.nvmlShutdown()
                except Exception as exc:
                    log.debug("nvmlShutdown failed: %s", exc)
            self._state = None
