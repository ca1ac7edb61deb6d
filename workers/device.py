"""Device selection: the GPU with the most free memory (pynvml), else the CPU."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Device:
    """Where a backend runs."""

    kind: Literal["cpu", "cuda"]
    index: int = 0
    name: str = "cpu"
    free_bytes: int = 0

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index} ({self.name})"


CPU = Device("cpu")


def list_gpus() -> list[Device]:
    """Every NVIDIA GPU pynvml can see, with its free memory; [] without a driver."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(Device("cuda", i, str(name), int(mem.free)))
        return gpus
    finally:
        pynvml.nvmlShutdown()


def select_device(preference: Literal["auto", "cpu", "cuda"] = "auto") -> Device:
    """``auto``: the GPU with most free memory if any, else CPU. The choice is logged."""
    if preference == "cpu":
        log.info("device: cpu (requested)")
        return CPU
    gpus = list_gpus()
    if not gpus:
        if preference == "cuda":
            log.warning("device: cuda requested but pynvml sees no GPU; using cpu")
        else:
            log.info("device: cpu (no GPU visible to pynvml)")
        return CPU
    best = max(gpus, key=lambda d: d.free_bytes)
    log.info(
        "device: %s with %.1f GiB free (of %d GPUs seen)", best, best.free_bytes / 2**30, len(gpus)
    )
    return best
