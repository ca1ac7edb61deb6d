"""Each instance of a Python model gets its own name in ``initialize``'s args, as Triton
names them (``<group name>_<index in the group>``, the group's name by default
``<model>_<group index>``), in a real model process; and the PyTorch backend keeps a 0-d
input 0-d. No Kafka."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from plaza.client import make_request
from plaza.modelconfig import ModelSpec, parse_model_config
from plaza.repository import ModelRepository, ModelVersion
from plaza.workers.backends.python_backend import PythonBackend, initialize_args, instance_name
from plaza.workers.device import CPU
from tests.python_models import write_model

NAMER_CONFIG = """
name: "namer"
backend: "python"
max_batch_size: 0
input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "NAME" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""

NAMER_MODEL = """
import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"] + "/" + args["model_instance_device_id"]

    def execute(self, requests):
        out = pb_utils.Tensor("NAME", np.array([self.name.encode()], np.object_))
        return [pb_utils.InferenceResponse([out]) for _ in requests]
"""


def _spec(groups: str, name: str = "m") -> ModelSpec:
    tensors = (
        'input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    )
    text = f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n{tensors}{groups}'
    return parse_model_config(text, source=f"{name}/config.pbtxt", default_name=name)


def test_instances_are_named_by_group_then_index_within_it() -> None:
    spec = _spec("instance_group [ { count: 2 kind: KIND_CPU }, { count: 3 kind: KIND_CPU } ]", "m")
    names = [instance_name(spec, i) for i in range(5)]
    assert names == ["m_0_0", "m_0_1", "m_1_0", "m_1_1", "m_1_2"]


def test_a_named_group_prefixes_its_instances_with_its_name() -> None:
    spec = _spec('instance_group [ { name: "cpu_pool" count: 2 }, { count: 1 } ]', "m")
    names = [instance_name(spec, i) for i in range(3)]
    assert names == ["cpu_pool_0", "cpu_pool_1", "m_1_0"]


def test_a_model_without_groups_has_one_instance_and_no_other() -> None:
    spec = _spec("", "solo")
    assert instance_name(spec, 0) == "solo_0_0"
    with pytest.raises(ValueError, match="has 1 instances"):
        instance_name(spec, 1)


def test_initialize_args_name_the_instance_asked_for(tmp_path: Path) -> None:
    root = write_model(tmp_path, "namer", NAMER_CONFIG, NAMER_MODEL)
    mv = ModelRepository(root).served_versions("namer")[0]
    assert initialize_args(mv, CPU, 1)["model_instance_name"] == "namer_0_1"
    assert initialize_args(mv, CPU, 1)["model_instance_device_id"] == "0"


def test_each_model_process_sees_its_own_instance_name(tmp_path: Path) -> None:
    root = write_model(tmp_path, "namer", NAMER_CONFIG, NAMER_MODEL)
    mv = ModelRepository(root).served_versions("namer")[0]
    seen = []
    for number in range(2):
        backend = PythonBackend(mv, CPU, instance=number)
        try:
            request = make_request("namer", {"X": np.array([1], np.int32)})
            (answer,) = backend.execute_requests([request])
            assert isinstance(answer, tuple)
            seen.append(answer[0].to_numpy()[0])
        finally:
            backend.unload()
    assert seen == [b"namer_0_0/0", b"namer_0_1/0"]


# pytorch_libtorch serves TorchScript, which only torch.jit (deprecated in torch) makes
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_a_0d_input_reaches_a_torchscript_module_as_0d(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="the PyTorch backend needs the torch extra")
    from plaza.workers.backends.torch import TorchBackend

    class Rank(torch.nn.Module):  # type: ignore[misc,name-defined]
        def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[name-defined]
            return torch.tensor(x.dim())

    path = tmp_path / "model.pt"
    torch.jit.script(Rank()).save(str(path))
    config = """
name: "rank"
platform: "pytorch_libtorch"
max_batch_size: 0
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_INT64 dims: [ -1 ] } ]
"""
    spec = parse_model_config(config, source="rank/config.pbtxt", default_name="rank")
    backend = TorchBackend(ModelVersion(spec, 1, path), CPU, threads=1)
    backend.load()
    scalar = np.frombuffer(np.float32(3.0).tobytes(), np.float32).reshape(())  # read-only 0-d
    assert backend.infer({"INPUT__0": scalar}, ["OUTPUT__0"])["OUTPUT__0"] == 0
    matrix = np.zeros((2, 3), np.float32)[:, ::2]  # not C-contiguous
    assert backend.infer({"INPUT__0": matrix}, ["OUTPUT__0"])["OUTPUT__0"] == 2
