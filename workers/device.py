"""Device selection: the GPU with the most free memory (pynvml), else the CPU.

Only the GPUs CUDA shows this process count: ``CUDA_VISIBLE_DEVICES`` (unset: all of them)
lists them by NVML index or by UUID (``GPU-...``, a unique prefix is enough), and CUDA
ignores an entry it cannot use and every entry after it (an empty value: no GPU). A
``Device``'s ``index`` is the GPU's position in that list, which is what torch's ``cuda:N``
and ONNX Runtime's ``device_id`` count; ``nvml_index`` is NVML's own number for it (the
memory meter reads that one). Integer entries are taken in NVML's order, the PCI bus order
(CUDA's too with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``). A MIG instance id is not mapped: it ends
the list like an unusable entry (a warning says so).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

log = logging.getLogger(__name__)

VISIBLE_DEVICES_ENV = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True, slots=True)
class Device:
    """Where a backend runs."""

    kind: Literal["cpu", "cuda"]
    index: int = 0
    """The CUDA ordinal: the position among the GPUs this process sees."""
    name: str = "cpu"
    free_bytes: int = 0
    nvml_index: int | None = None
    """NVML's number for the GPU (None on the CPU)."""

    def __str__(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index} ({self.name})"


CPU = Device("cpu")


def visible_gpus(raw: str | None, count: int, uuid_of: Callable[[int], str]) -> list[int]:
    """The NVML indices of the GPUs CUDA shows, in CUDA's order, for ``CUDA_VISIBLE_DEVICES``
    = ``raw`` (None: unset) among ``count`` GPUs; ``uuid_of(i)`` is GPU i's UUID."""
    if raw is None:
        return list(range(count))
    chosen: list[int] = []
    for entry in (e.strip() for e in raw.split(",")):
        index = _entry_index(entry, count, uuid_of)
        if index is None or index in chosen:  # CUDA stops at an entry it cannot use
            if entry:
                log.warning(
                    "device: %s entry %r is not an index or GPU UUID of this machine (or a "
                    "repeat): it and the entries after it are not used",
                    VISIBLE_DEVICES_ENV,
                    entry,
                )
            break
        chosen.append(index)
    return chosen


def _entry_index(entry: str, count: int, uuid_of: Callable[[int], str]) -> int | None:
    if entry.isdigit():
        return int(entry) if int(entry) < count else None
    if entry.upper().startswith("GPU-"):
        prefix = entry.lower()
        matches = [i for i in range(count) if uuid_of(i).lower().startswith(prefix)]
        return matches[0] if len(matches) == 1 else None
    return None  # a MIG instance, -1, or no GPU at all


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def list_gpus() -> list[Device]:
    """The NVIDIA GPUs CUDA shows this process, with their free memory; [] without a driver."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex
        visible = visible_gpus(
            os.environ.get(VISIBLE_DEVICES_ENV),
            pynvml.nvmlDeviceGetCount(),
            lambda i: _text(pynvml.nvmlDeviceGetUUID(handle(i))),
        )
        gpus = []
        for position, physical in enumerate(visible):
            name = _text(pynvml.nvmlDeviceGetName(handle(physical)))
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle(physical))
            gpus.append(Device("cuda", position, name, int(mem.free), physical))
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
            log.warning("device: cuda requested but no GPU is visible; using cpu")
        else:
            log.info("device: cpu (no GPU visible: pynvml, %s)", VISIBLE_DEVICES_ENV)
        return CPU
    best = max(gpus, key=lambda d: d.free_bytes)
    log.info(
        "device: %s (NVML GPU %s) with %.1f GiB free (of %d GPUs visible)",
        best,
        best.nvml_index,
        best.free_bytes / 2**30,
        len(gpus),
    )
    return best
