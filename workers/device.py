"""Device selection: the GPU with the most free memory (pynvml), else the CPU.

Only the GPUs CUDA shows this process count: ``CUDA_VISIBLE_DEVICES`` (unset: all of them)
lists them by NVML index or by UUID (``GPU-...``, a unique prefix is enough), and CUDA
ignores an entry it cannot use and every entry after it (an empty value: no GPU). A
``Device``'s ``index`` is the GPU's position in that list, which is what torch's ``cuda:N``
and ONNX Runtime's ``device_id`` count; ``nvml_index`` is NVML's own number for it (the
memory meter reads that one). Integer entries are taken in NVML's order, the PCI bus order
(CUDA's too with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``). A MIG instance id is not mapped: it ends
the list like an unusable entry (a warning says so).

``worker.device=cuda`` on a machine where CUDA shows no GPU is a ConfigError at worker start
(Triton fails a ``KIND_GPU`` model there too): a broken GPU node fails, rather than serving
slowly on the CPU. ``auto`` falls back to the CPU. On a GPU, a model whose ``instance_group``
names GPUs (``gpus``) that this process cannot see is refused (``check_instance_gpus``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from plaza.errors import ConfigError
from plaza.modelconfig import InstanceGroup

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
    visible: int = field(default=0, compare=False)
    """How many GPUs CUDA shows this process (0 on the CPU): the valid CUDA ordinals."""

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
    """``auto``: the GPU with most free memory if any, else CPU; ``cuda``: that GPU, and a
    ConfigError (``bad_config``) if none is visible. The choice is logged."""
    if preference == "cpu":
        log.info("device: cpu (requested)")
        return CPU
    gpus = list_gpus()
    if not gpus:
        if preference == "cuda":
            raw = os.environ.get(VISIBLE_DEVICES_ENV)
            shown = "unset" if raw is None else f"={raw!r}"
            raise ConfigError(
                "worker.device is cuda but no GPU is visible to this process (no NVIDIA "
                f"driver or GPU found through pynvml; {VISIBLE_DEVICES_ENV} {shown}); "
                "use worker.device=auto or cpu to serve on the CPU",
                field="worker.device",
            )
        log.info("device: cpu (no GPU visible: pynvml, %s)", VISIBLE_DEVICES_ENV)
        return CPU
    best = replace(max(gpus, key=lambda d: d.free_bytes), visible=len(gpus))
    log.info(
        "device: %s (NVML GPU %s) with %.1f GiB free (of %d GPUs visible)",
        best,
        best.nvml_index,
        best.free_bytes / 2**30,
        len(gpus),
    )
    return best


def check_instance_gpus(model: str, groups: Sequence[InstanceGroup], device: Device) -> None:
    """Refuse a model whose ``instance_group[i].gpus`` names a GPU this process cannot see,
    when it runs on a GPU: a ConfigError (``bad_config``) naming the ids and how many GPUs
    are visible. On the CPU ``gpus`` is ignored, as ``kind`` is."""
    if device.kind != "cuda":
        return
    for i, group in enumerate(groups):
        unseen = [g for g in group.gpus if not 0 <= g < device.visible]
        if unseen:
            raise ConfigError(
                f"model {model!r}: field 'instance_group[{i}].gpus': GPU ids {unseen} are not "
                f"visible to this worker: it sees {device.visible} GPU(s), ids 0 to "
                f"{device.visible - 1} (CUDA's numbering after {VISIBLE_DEVICES_ENV})",
                field=f"instance_group[{i}].gpus",
            )
