"""The ONNX backend checks a config against its model at load, as Triton does: a name, a
type or a shape the model cannot take is a bad_config then, not a failure of every request."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from onnx import TensorProto

from plaza.errors import ConfigError
from plaza.modelconfig import parse_model_config
from plaza.repository import ModelVersion
from plaza.workers.backends.onnx import OnnxBackend
from plaza.workers.device import CPU
from tests.unit.test_autocomplete import tensor, write_model

GOOD = """
name: "m" platform: "onnxruntime_onnx" max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 4, -1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4, -1 ] } ]
"""


def load(tmp_path: Path, config: str, first: int | str = "batch") -> None:
    path = write_model(
        tmp_path / "m",
        [tensor("x", TensorProto.FLOAT, [first, 4, "n"])],
        [tensor("y", TensorProto.FLOAT, [first, 4, "n"])],
    )
    spec = parse_model_config(config, source="m/config.pbtxt", default_name="m")
    OnnxBackend(ModelVersion(spec, 1, path), CPU, threads=1).load()


def test_a_config_the_model_takes_loads(tmp_path: Path) -> None:
    load(tmp_path, GOOD)
    load(tmp_path, GOOD.replace("dims: [ 4, -1 ] }", "dims: [ 4, 7 ] }"))  # narrower: fine


@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (('name: "x"', 'name: "z"'), "input 'z' is not in the model"),
        (
            (
                "data_type: TYPE_FP32 dims: [ 4, -1 ] } ]\noutput",
                "data_type: TYPE_INT64 dims: [ 4, -1 ] } ]\noutput",
            ),
            "input 'x' is INT64 but the model's is tensor(float)",
        ),
        (("dims: [ 4, -1 ] }", "dims: [ 4 ] }"), "input 'x' does not fit"),
        (("dims: [ 4, -1 ] }", "dims: [ 5, -1 ] }"), "input 'x' does not fit"),
        (("max_batch_size: 8", "max_batch_size: 0"), "input 'x' does not fit"),
    ],
)
def test_a_config_the_model_cannot_take_is_a_bad_config(
    tmp_path: Path, edit: tuple[str, str], why: str
) -> None:
    old, new = edit
    assert old in GOOD
    with pytest.raises(ConfigError, match=re.escape(why)) as info:
        load(tmp_path, GOOD.replace(old, new, 1))
    assert info.value.code == "bad_config"


def test_a_model_with_a_fixed_first_dimension_cannot_batch(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot batch"):
        load(tmp_path, GOOD, first=1)
    unbatched = GOOD.replace("max_batch_size: 8", "max_batch_size: 0").replace(
        "dims: [ 4, -1 ]", "dims: [ 1, 4, -1 ]"
    )
    load(tmp_path, unbatched, first=1)  # the whole shape, as the config says: fine
