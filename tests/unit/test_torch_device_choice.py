"""The PyTorch backend on a GPU worker: a torch that cannot use CUDA is a load failure
(``bad_config``), never a model run on the CPU instead (workers/backends/torch.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from plaza.errors import ConfigError
from plaza.modelconfig import parse_model_config
from plaza.repository import ModelVersion
from plaza.workers.device import Device

torch = pytest.importorskip("torch", reason="the PyTorch backend needs the torch extra")
from plaza.workers.backends.torch import TorchBackend  # noqa: E402

CONFIG = """
name: "m" platform: "pytorch_libtorch" max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""
GPU = Device("cuda", index=1, name="Test GPU", nvml_index=1, visible=2)


class Loads:
    """A stand-in for ``torch.jit.load`` that records where it was asked to load."""

    def __init__(self) -> None:
        self.map_locations: list[Any] = []

    def __call__(self, path: str, map_location: Any = None) -> Any:
        self.map_locations.append(map_location)
        return Module()


class Module:
    """A loaded module that says nothing of its arguments (config order applies)."""

    def eval(self) -> Module:
        return self


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> Loads:
    recorder = Loads()
    monkeypatch.setattr(torch.jit, "load", recorder)
    return recorder


def backend(tmp_path: Path) -> TorchBackend:
    spec = parse_model_config(CONFIG, source="m/config.pbtxt", default_name="m")
    return TorchBackend(ModelVersion(spec, 1, tmp_path / "model.pt"), GPU, threads=1)


@pytest.mark.parametrize(
    ("built_with", "says"),
    [
        (None, r"torch \S+ was built without CUDA; install a CUDA build or set worker.device=cpu"),
        ("12.4", r"torch \S+ \(CUDA 12.4\) cannot use the GPU; .* or set worker.device=cpu"),
    ],
)
def test_a_torch_without_cuda_refuses_a_gpu_worker_s_model(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    loads: Loads,
    built_with: str | None,
    says: str,
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", built_with)
    model = backend(tmp_path)
    with pytest.raises(ConfigError, match=says) as raised:
        model.load()
    assert raised.value.code == "bad_config"
    assert "cuda:1 (Test GPU)" in raised.value.message
    assert loads.map_locations == []  # nothing was loaded, on the CPU or anywhere
    with pytest.raises(RuntimeError, match="not loaded"):
        model.infer({}, ["y"])


def test_a_torch_with_cuda_loads_on_the_worker_s_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, loads: Loads
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    backend(tmp_path).load()
    assert loads.map_locations == [torch.device("cuda:1")]
