"""A host's memory budget: what each loaded model holds, and whom to evict to make room.

Pure bookkeeping (no I/O, no clock): ``MemoryBudget`` records the bytes each model on the
host is accounted for and when it was last used (a counter the host bumps, not a time), and
``plan`` answers which idle models to unload, least recently used first, so that a model
needing ``need`` bytes fits. A model with work in flight is never chosen; when the idle
ones do not free enough, there is no plan and the load waits.

How many bytes a model holds (``estimate_bytes``): its config parameter ``memory_bytes``
when set (an operator's figure, or a test's synthetic size), else the size of its served
version folders' files times its instance count (every instance loads its own copy). The
host corrects the estimate after a load with what it measured (``MemoryMeter``): the
process's RSS growth on CPU, the device's used memory growth from pynvml on a GPU.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

from plaza.errors import ConfigError
from plaza.modelconfig import ModelSpec
from plaza.repository import ModelRepository

log = logging.getLogger(__name__)

MEMORY_BYTES_PARAMETER = "memory_bytes"
LAZY_PARAMETER = "lazy"


def declared_bytes(spec: ModelSpec) -> int | None:
    """The config parameter ``memory_bytes`` (None when absent); ConfigError when bad."""
    raw = spec.parameters.get(MEMORY_BYTES_PARAMETER)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(f"model {spec.name!r}: parameters.memory_bytes {raw!r} is not bytes >= 0")
    return value


def is_lazy(spec: ModelSpec) -> bool:
    """The config parameter ``lazy`` ("true"/"1"/"yes"): load on the first request."""
    return spec.parameters.get(LAZY_PARAMETER, "").strip().lower() in {"true", "1", "yes"}


def estimate_bytes(repo: ModelRepository, spec: ModelSpec) -> int:
    """The bytes a model is expected to hold once loaded (see the module doc)."""
    declared = declared_bytes(spec)
    if declared is not None:
        return declared
    total = 0
    for mv in repo.served_versions(spec.name, spec):
        folder = repo.root / spec.name / str(mv.version)
        for path in folder.rglob("*"):
            if path.is_file():
                total += path.stat().st_size
    return total * max(1, spec.instance_count)


@dataclass(slots=True)
class MemoryBudget:
    """Accounted bytes per model on one host, within ``limit`` (0: no limit)."""

    limit: int
    held: dict[str, int] = field(default_factory=dict)
    last_used: dict[str, int] = field(default_factory=dict)
    peak: int = 0
    """The largest total ever accounted (what a test checks against the limit)."""
    _clock: int = 0

    @property
    def total(self) -> int:
        return sum(self.held.values())

    def fits_alone(self, need: int) -> bool:
        """Whether ``need`` bytes could ever fit (the whole budget free)."""
        return self.limit <= 0 or need <= self.limit

    def touch(self, model: str) -> None:
        """``model`` was used now (it becomes the most recently used)."""
        self._clock += 1
        self.last_used[model] = self._clock

    def plan(self, model: str, need: int, busy: Collection[str]) -> list[str] | None:
        """The models to unload, least recently used first, so that ``need`` more bytes for
        ``model`` fit; [] when they fit already; None when evicting every idle model (not
        ``busy``, not ``model``) would not free enough."""
        if self.limit <= 0:
            return []
        free = self.limit - (self.total - self.held.get(model, 0))
        if need <= free:
            return []
        idle = [m for m in self.held if m != model and m not in busy]
        idle.sort(key=lambda m: self.last_used.get(m, 0))
        chosen: list[str] = []
        for victim in idle:
            chosen.append(victim)
            free += self.held[victim]
            if need <= free:
                return chosen
        return None

    def add(self, model: str, nbytes: int) -> None:
        """Account ``nbytes`` for ``model`` (replacing what it had) and mark it used."""
        self.held[model] = max(0, nbytes)
        self.touch(model)
        self.peak = max(self.peak, self.total)

    def remove(self, model: str) -> int:
        """Forget ``model``; the bytes it was accounted for."""
        self.last_used.pop(model, None)
        return self.held.pop(model, 0)


class MemoryMeter(Protocol):
    """Bytes in use now, as the host measures them around a load."""

    kind: str

    def used(self) -> int: ...


class RssMeter:
    """The process's resident set size (Linux /proc; 0 elsewhere)."""

    kind = "rss"

    def used(self) -> int:
        try:
            with open("/proc/self/statm") as f:
                resident = int(f.read().split()[1])
        except (OSError, ValueError, IndexError):
            return 0
        return resident * os.sysconf("SC_PAGE_SIZE")


class NvmlMeter:
    """Used memory of one GPU from pynvml. Not exercised by the tests (no GPU here)."""

    kind = "nvml"

    def __init__(self, index: int, nvml: Any | None = None) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nvml: Any = nvml
        self._nvml.nvmlInit()
        self._handle = self._nvml.nvmlDeviceGetHandleByIndex(index)

    def used(self) -> int:
        try:
            return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
        except Exception as exc:  # a driver hiccup: account the estimate alone
            log.warning("nvml: memory unknown: %s", exc)
            return 0


def meter_for(device_kind: str, index: int = 0) -> MemoryMeter:
    """pynvml on a GPU (RSS when pynvml cannot start), RSS on CPU."""
    if device_kind == "cuda":
        try:
            return NvmlMeter(index)
        except Exception as exc:
            log.warning("memory budget: pynvml unavailable (%s); measuring RSS", exc)
    return RssMeter()
