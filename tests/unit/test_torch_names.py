"""Triton's libtorch naming conventions: which config tensor is which argument and which
result of a TorchScript forward (workers/backends/torch_names.py, and the backend with a
real TorchScript module where torch is installed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from plaza.errors import ConfigError
from plaza.modelconfig import parse_model_config
from plaza.repository import ModelVersion
from plaza.workers.backends.torch_names import (
    CONFIG_ORDER,
    FORWARD_ARGUMENT,
    NAMED_INDEX,
    argument_order,
    input_convention,
    named_index,
    result_order,
)
from plaza.workers.device import CPU


def test_a_named_index_is_the_digits_after_the_first_double_underscore() -> None:
    assert named_index("INPUT__0") == 0 and named_index("x__12") == 12
    assert named_index("INPUT") is None and named_index("INPUT__") is None
    assert named_index("my__name__1") is None  # "name__1" is not all digits: no index


def test_the_inputs_convention_is_chosen_as_triton_chooses_it() -> None:
    assert input_convention(["b", "a"], ["a", "b"]) == FORWARD_ARGUMENT
    assert input_convention(["IN__1", "IN__0"], ["x", "y"]) == NAMED_INDEX
    assert input_convention(["IN__1", "IN__0"], None) == NAMED_INDEX
    assert input_convention(["a", "IN__0"], ["x", "y"]) == CONFIG_ORDER


def test_inputs_go_to_their_arguments_by_name_by_index_or_in_config_order() -> None:
    assert argument_order("m", ["b", "a"], [], ["a", "b"]) == ["a", "b"]
    assert argument_order("m", ["IN__1", "IN__0"], [], ["x", "y"]) == ["IN__0", "IN__1"]
    assert argument_order("m", ["b", "a"], ["START"], ["x", "y", "z"]) == ["b", "a", "START"]
    # a stateful model's control inputs follow the convention of the config's inputs
    assert argument_order("m", ["x__1"], ["START__0"], None) == ["START__0", "x__1"]


def test_an_input_without_a_place_or_places_with_a_gap_are_refused() -> None:
    with pytest.raises(ConfigError, match="'START' has no argument of forward"):
        argument_order("m", ["a"], ["START"], ["a", "total"])
    with pytest.raises(ConfigError, match=r"positions \[0, 2\]"):
        argument_order("m", ["IN__0", "IN__2"], [], None)
    with pytest.raises(ConfigError, match=r"positions \[1, 1\]"):
        argument_order("m", ["A__1", "B__1"], [], None)


def test_outputs_are_results_by_index_or_in_config_order() -> None:
    assert result_order("m", ["SUM__1", "DIFF__0"], []) == {"SUM__1": 1, "DIFF__0": 0}
    assert result_order("m", ["OUTPUT", "EXTRA"], ["SUM_OUT"]) == {
        "OUTPUT": 0,
        "EXTRA": 1,
        "SUM_OUT": 2,
    }
    with pytest.raises(ConfigError, match="'SUM_OUT' does not read <name>__<index>"):
        result_order("m", ["OUT__0"], ["SUM_OUT"])


CONFIG = """
name: "m" platform: "pytorch_libtorch" max_batch_size: 4
input [ { name: "a" data_type: TYPE_FP32 dims: [ 2 ] },
        { name: "b" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "SUM__1" data_type: TYPE_FP32 dims: [ 2 ] },
         { name: "DIFF__0" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""


# pytorch_libtorch serves TorchScript, which only torch.jit (deprecated in torch) makes
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
def test_a_torchscript_module_gets_its_arguments_by_name_and_gives_results_by_index(
    tmp_path: Path,
) -> None:
    """forward(b, a) returns (a - b, a + b); the config lists a before b and SUM__1 before
    DIFF__0: each tensor still reaches its place, and each output is its own result."""
    torch = pytest.importorskip("torch", reason="the PyTorch backend needs the torch extra")
    from plaza.workers.backends.torch import TorchBackend

    class Swapped(torch.nn.Module):
        def forward(self, b: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return a - b, a + b

    path = tmp_path / "model.pt"
    torch.jit.script(Swapped()).save(str(path))
    spec = parse_model_config(CONFIG, source="m/config.pbtxt", default_name="m")
    backend = TorchBackend(ModelVersion(spec, 1, path), CPU, threads=1)
    backend.load()
    a = np.array([[10.0, 20.0]], np.float32)
    b = np.array([[1.0, 2.0]], np.float32)
    out = backend.infer({"a": a, "b": b}, ["SUM__1", "DIFF__0"])
    np.testing.assert_array_equal(out["SUM__1"], a + b)
    np.testing.assert_array_equal(out["DIFF__0"], a - b)
