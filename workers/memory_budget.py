"""A host's memory budget: what each loaded model holds, and whom to evict to make room.

Pure bookkeeping (no I/O, no clock): ``MemoryBudget`` records the bytes each model on the
host is accounted for and when it was last used (a counter the host bumps, not a time), and
``plan`` answers which idle models to unload, least recently used first, so that a model
needing ``need`` bytes fits. A model with work in flight is never chosen; when the idle
ones do not free enough, there is no plan and the load waits.

How many bytes a model holds (``estimate_bytes``): its config parameter ``memory_bytes``
when set (an operator's figure, or a test's synthetic size), else the size of its served
version folders' files times its instance count (every instance loads its own copy). The
host corrects the estimate after a load with what it measured (``MemoryMeter``): on CPU the
growth of the resident memory of the host process and of every process it started (a Python
backend's model process and whatever that process started), on a GPU the growth of the
device's used memory from pynvml. A reading that fails is unknown (None): the estimate stands.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from plaza.errors import ConfigError
from plaza.modelconfig import ModelSpec
from plaza.repository import ModelRepository
from plaza.workers.device import Device

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

    def fits_now(self, need: int) -> bool:
        """Whether ``need`` more bytes fit beside what is accounted, evicting nothing."""
        return self.limit <= 0 or self.total + need <= self.limit

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

    def swap(self, a: str, b: str) -> None:
        """Exchange the accounts of ``a`` and ``b`` (bytes and last use): a reload's new
        unit takes over the model's account, the old one's goes to the other."""
        for accounts in (self.held, self.last_used):
            of_a, of_b = accounts.pop(a, None), accounts.pop(b, None)
            if of_b is not None:
                accounts[a] = of_b
            if of_a is not None:
                accounts[b] = of_a

    def remove(self, model: str) -> int:
        """Forget ``model``; the bytes it was accounted for."""
        self.last_used.pop(model, None)
        return self.held.pop(model, 0)


class MemoryMeter(Protocol):
    """Bytes in use now, as the host measures them around a load; None when unknown."""

    kind: str

    def used(self) -> int | None: ...


class _Proc(NamedTuple):
    """What the host's meter reads of one process in /proc/<pid>/stat."""

    ppid: int
    """Its parent's pid."""
    pgrp: int
    """Its process group."""
    rss_pages: int
    """Its resident set size, in pages."""


def _read_stat(path: Path) -> _Proc | None:
    try:
        text = path.read_text()
    except OSError:  # it ended meanwhile, or is not ours to read
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = text[text.rfind(")") + 2 :].split()
    try:
        return _Proc(int(fields[1]), int(fields[2]), int(fields[21]))
    except (IndexError, ValueError):
        return None


def _processes(proc: Path) -> dict[int, _Proc]:
    found: dict[int, _Proc] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            stat = _read_stat(entry / "stat")
            if stat is not None:
                found[int(entry.name)] = stat
    return found


def family(pid: int, processes: Mapping[int, _Proc]) -> set[int]:
    """``pid``, its descendants, and the members of the process groups its descendants lead
    (a Python model's helpers stay in its group even once orphaned)."""
    children: dict[int, list[int]] = {}
    for p, stat in processes.items():
        children.setdefault(stat.ppid, []).append(p)
    members, todo = {pid}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in members:
                members.add(child)
                todo.append(child)
    leaders = members - {pid}
    members |= {p for p, stat in processes.items() if stat.pgrp in leaders}
    return members


class RssMeter:
    """Resident memory of the host process and of every process it started (Linux /proc;
    None elsewhere): a Python backend's model runs in a child process of the host."""

    kind = "rss"

    def __init__(self, pid: int | None = None, proc: Path = Path("/proc")) -> None:
        self._pid = os.getpid() if pid is None else pid
        self._proc = proc

    def used(self) -> int | None:
        try:
            processes = _processes(self._proc)
        except OSError:
            return None
        if self._pid not in processes:
            return None
        pages = sum(processes[p].rss_pages for p in family(self._pid, processes))
        return pages * os.sysconf("SC_PAGE_SIZE")


class NvmlMeter:
    """Used memory of one GPU (its NVML index) from pynvml."""

    kind = "nvml"

    def __init__(self, index: int, nvml: Any | None = None) -> None:
        if nvml is None:
            import pynvml

            nvml = pynvml
        self._nvml: Any = nvml
        self._nvml.nvmlInit()
        self.index = index
        self._handle = self._nvml.nvmlDeviceGetHandleByIndex(index)

    def used(self) -> int | None:
        try:
            return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
        except Exception as exc:  # a driver hiccup: unknown, not 0 (the estimate stands)
            log.warning("nvml: memory of GPU %d unknown: %s", self.index, exc)
            return None


def meter_for(device: Device) -> MemoryMeter:
    """pynvml on the device's GPU (RSS when pynvml cannot start or the GPU has no NVML
    index), RSS on CPU."""
    if device.kind == "cuda":
        if device.nvml_index is None:
            log.warning("memory budget: %s has no NVML index; measuring RSS", device)
            return RssMeter()
        try:
            return NvmlMeter(device.nvml_index)
        except Exception as exc:
            log.warning("memory budget: pynvml unavailable (%s); measuring RSS", exc)
    return RssMeter()
