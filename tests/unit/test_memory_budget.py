"""The memory budget's bookkeeping: least recently used idle models go first, busy never."""

from __future__ import annotations

from pathlib import Path

import pytest

from plaza.errors import ConfigError
from plaza.repository import ModelRepository
from plaza.workers.memory_budget import (
    MemoryBudget,
    NvmlMeter,
    declared_bytes,
    estimate_bytes,
    is_lazy,
)

CONFIG = """
name: "{name}"
backend: "plaza_simulated"
max_batch_size: 4
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
parameters [ {parameters} ]
"""


def _param(key: str, value: str) -> str:
    return f'{{ key: "{key}" value: {{ string_value: "{value}" }} }}'


def _model(root: Path, name: str, count: int = 1, **params: str) -> None:
    (root / name / "1").mkdir(parents=True)
    body = ", ".join(_param(k, v) for k, v in params.items())
    (root / name / "config.pbtxt").write_text(
        CONFIG.format(name=name, count=count, parameters=body)
    )


def test_fits_without_evicting_while_there_is_room() -> None:
    budget = MemoryBudget(300)
    budget.add("a", 100)
    assert budget.plan("b", 200, busy=()) == []
    budget.add("b", 200)
    assert budget.total == 300 and budget.peak == 300


def test_the_least_recently_used_idle_model_goes_first() -> None:
    budget = MemoryBudget(300)
    budget.add("a", 100)
    budget.add("b", 100)
    budget.add("c", 100)
    budget.touch("a")  # b is now the least recently used
    assert budget.plan("d", 100, busy=()) == ["b"]
    assert budget.plan("d", 200, busy=()) == ["b", "c"]


def test_a_busy_model_is_never_evicted() -> None:
    budget = MemoryBudget(200)
    budget.add("a", 100)
    budget.add("b", 100)
    assert budget.plan("c", 100, busy={"a"}) == ["b"]
    assert budget.plan("c", 100, busy={"a", "b"}) is None  # the load waits


def test_no_plan_when_the_idle_models_do_not_free_enough() -> None:
    budget = MemoryBudget(300)
    budget.add("a", 200)
    budget.add("b", 50)
    assert budget.plan("c", 150, busy={"a"}) is None
    assert budget.plan("c", 150, busy=()) == ["a"]  # a alone is enough (b is newer)


def test_a_model_reloading_counts_its_own_bytes_as_free() -> None:
    budget = MemoryBudget(200)
    budget.add("a", 150)
    assert budget.plan("a", 200, busy=()) == []
    assert not budget.fits_alone(201) and budget.fits_alone(200)


def test_no_limit_never_evicts() -> None:
    budget = MemoryBudget(0)
    budget.add("a", 10**12)
    assert budget.plan("b", 10**12, busy=()) == [] and budget.fits_alone(10**15)


def test_remove_frees_and_forgets() -> None:
    budget = MemoryBudget(100)
    budget.add("a", 60)
    assert budget.remove("a") == 60 and budget.total == 0 and budget.remove("a") == 0
    assert budget.peak == 60


def test_estimates_from_the_parameter_or_the_files_times_instances(tmp_path: Path) -> None:
    _model(tmp_path, "declared", memory_bytes="12345", lazy="true")
    _model(tmp_path, "files", count=2, lazy="false")
    (tmp_path / "files" / "1" / "weights.bin").write_bytes(b"x" * 1000)
    repo = ModelRepository(tmp_path)
    declared, files = repo.spec("declared"), repo.spec("files")
    assert estimate_bytes(repo, declared) == 12345 and is_lazy(declared)
    assert estimate_bytes(repo, files) == 2000 and not is_lazy(files)
    assert declared_bytes(files) is None


def test_a_bad_memory_bytes_is_a_config_error(tmp_path: Path) -> None:
    _model(tmp_path, "bad", memory_bytes="lots")
    with pytest.raises(ConfigError, match="memory_bytes"):
        declared_bytes(ModelRepository(tmp_path).spec("bad"))


class _FakeNvml:
    class _Info:
        used = 4096

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Info:
        return self._Info()


def test_the_gpu_meter_reads_used_memory_through_nvml() -> None:
    assert NvmlMeter(0, nvml=_FakeNvml()).used() == 4096
