"""Model config cases where Plaza refused or misread what Triton takes: an ONNX optional input
that is an overridable initializer, warmup samples of ``batch_size`` 0 and of models that do
not batch, ``intra_op_thread_count: "0"``, and the platform/backend pair and file name that
Triton's normalized config (its config endpoint) fills in."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from plaza.errors import ConfigError
from plaza.modelconfig import ModelSpec, parse_model_config, parse_model_config_json
from plaza.repository import ModelVersion
from plaza.workers import warmup
from plaza.workers.backends.base import thread_count
from plaza.workers.backends.onnx import OnnxBackend
from plaza.workers.device import Device
from plaza.workers.runner import BatchRunner

# --- an optional input backed by an overridable initializer -------------------------------

OPT = """
name: "opt" platform: "onnxruntime_onnx" max_batch_size: 8
input [ {{ name: "A" data_type: TYPE_FP32 dims: [ 2 ] }},
        {{ name: "B" data_type: {b_type} dims: [ 2 ] {b_optional} }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 2 ] }} ]
"""


def add_model(path: Path) -> Path:
    """Y = A + B, where B is also an initializer (10, 10): a graph input it may override."""
    a, b, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 2]) for n in "ABY")
    b_default = numpy_helper.from_array(np.full((1, 2), 10, np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("Add", ["A", "B"], ["Y"])], "opt", [a, b], [y], [b_default]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def opt_backend(
    tmp_path: Path, b_optional: str = "optional: true", b_type: str = "TYPE_FP32"
) -> OnnxBackend:
    text = OPT.format(b_optional=b_optional, b_type=b_type)
    spec = parse_model_config(text, source="opt/config.pbtxt", default_name="opt")
    mv = ModelVersion(spec, 1, add_model(tmp_path / "model.onnx"))
    return OnnxBackend(mv, Device("cpu"), threads=1)


def test_an_optional_input_may_be_an_overridable_initializer(tmp_path: Path) -> None:
    backend = opt_backend(tmp_path)
    backend.load()
    a = np.ones((2, 2), np.float32)
    sent = backend.infer({"A": a, "B": np.full((2, 2), 100, np.float32)}, ["Y"])
    assert sent["Y"].tolist() == [[101.0, 101.0]] * 2  # the request's B overrides it
    left_out = backend.infer({"A": a}, ["Y"])
    assert left_out["Y"].tolist() == [[11.0, 11.0]] * 2  # the initializer's value


def test_a_required_input_that_is_only_an_initializer_is_refused(tmp_path: Path) -> None:
    backend = opt_backend(tmp_path, b_optional="")
    with pytest.raises(ConfigError) as info:
        backend.load()
    assert info.value.code == "bad_config"
    assert "'B'" in info.value.message and "only an overridable initializer" in info.value.message


def test_an_initializer_input_of_another_type_is_refused(tmp_path: Path) -> None:
    backend = opt_backend(tmp_path, b_type="TYPE_INT32")
    with pytest.raises(ConfigError, match=r"input 'B' is INT32 but the model's is tensor\(float\)"):
        backend.load()


# --- warmup: batch_size 0, and models that do not batch ----------------------------------

WARM = """
name: "m" platform: "onnxruntime_onnx" max_batch_size: {mbs}
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
{entries}
"""


def warm_spec(max_batch_size: int, *entries: str) -> ModelSpec:
    listed = "\n".join(
        f'model_warmup [ {{ {e} inputs {{ key: "x" value {{ data_type: TYPE_FP32 '
        "dims: [ 4 ] zero_data: true } } } ]"
        for e in entries
    )
    text = WARM.format(mbs=max_batch_size, entries=listed)
    return parse_model_config(text, source="m/config.pbtxt", default_name="m")


class Shapes:
    """A backend that keeps the shape of each call's input."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, ...]] = []

    def infer(self, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
        self.calls.append(inputs["x"].shape)
        return {"y": inputs["x"]}


@pytest.mark.parametrize("max_batch_size", [0, 8])
def test_a_sample_of_batch_size_0_is_skipped(tmp_path: Path, max_batch_size: int) -> None:
    s = warm_spec(max_batch_size, 'name: "none"', 'name: "one" batch_size: 1')
    assert [sample.name for sample in warmup.samples(s, tmp_path)] == ["one"]


def test_a_model_that_does_not_batch_gets_batch_size_requests(tmp_path: Path) -> None:
    s = warm_spec(0, 'name: "three" batch_size: 3 count: 2')
    backend = Shapes()
    runner = BatchRunner(s, {1: backend})  # type: ignore[dict-item]
    warmup.run(runner, 1, warmup.samples(s, tmp_path))
    assert backend.calls == [(4,)] * 6  # 3 requests of the sample, one by one, twice


def test_a_model_that_does_not_batch_has_its_batch_size_bounded(tmp_path: Path) -> None:
    too_many = warmup.MAX_UNBATCHED_REQUESTS + 1
    with pytest.raises(ConfigError) as info:
        warmup.samples(warm_spec(0, f'name: "many" batch_size: {too_many}'), tmp_path)
    assert info.value.code == "bad_config"
    assert f"batch_size {too_many} is outside 1..{warmup.MAX_UNBATCHED_REQUESTS}" in str(
        info.value.message
    )


# --- intra_op_thread_count ----------------------------------------------------------------


def threads_of(param: str, configured: int) -> int:
    text = (
        'name: "t" platform: "onnxruntime_onnx" max_batch_size: 0 '
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ] '
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ] '
        f'parameters {{ key: "intra_op_thread_count" value {{ string_value: "{param}" }} }}'
    )
    spec = parse_model_config(text, source="t/config.pbtxt", default_name="t")
    return thread_count(ModelVersion(spec, 1, Path("t/1/model.onnx")), configured)


@pytest.mark.parametrize("param", ["0", "-2"])
def test_an_intra_op_thread_count_of_0_or_less_is_left_to_the_worker(param: str) -> None:
    assert threads_of(param, configured=3) == 3


def test_a_positive_intra_op_thread_count_still_wins() -> None:
    assert threads_of("2", configured=3) == 2


# --- the config endpoint's platform, backend and default_model_filename -------------------

TENSORS = (
    'max_batch_size: 0 input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ] '
    'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]'
)


@pytest.mark.parametrize(
    ("names", "platform", "backend", "filename"),
    [
        ('platform: "onnxruntime_onnx"', "onnxruntime_onnx", "onnxruntime", "model.onnx"),
        ('backend: "onnxruntime"', "onnxruntime_onnx", "onnxruntime", "model.onnx"),
        ('platform: "pytorch_libtorch"', "pytorch_libtorch", "pytorch", "model.pt"),
        ('backend: "pytorch"', "pytorch_libtorch", "pytorch", "model.pt"),
        ('backend: "python"', "", "python", "model.py"),
        (
            'backend: "onnxruntime" default_model_filename: "net.onnx"',
            "onnxruntime_onnx",
            "onnxruntime",
            "net.onnx",
        ),
    ],
)
def test_the_served_config_fills_the_platform_backend_pair_and_file_name(
    names: str, platform: str, backend: str, filename: str
) -> None:
    spec = parse_model_config(f"{names} {TENSORS}", source="m/config.pbtxt", default_name="m")
    doc = spec.config_json()
    assert (doc["platform"], doc["backend"], doc["default_model_filename"]) == (
        platform,
        backend,
        filename,
    )
    assert spec.platform == (platform or "python")  # what is matched on is unchanged
    again = parse_model_config_json(json.dumps(doc), source="override", default_name="m")
    assert again.config == spec.config  # read back as an override: the same config


def test_an_ensembles_served_config_names_no_backend() -> None:
    text = (
        'platform: "ensemble" max_batch_size: 0 '
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ] '
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ] '
        'ensemble_scheduling { step [ { model_name: "m" model_version: -1 '
        'input_map { key: "x" value: "X" } output_map { key: "y" value: "Y" } } ] }'
    )
    doc = parse_model_config(text, source="e/config.pbtxt", default_name="e").config_json()
    assert (doc["platform"], doc["backend"], doc["default_model_filename"]) == ("ensemble", "", "")
