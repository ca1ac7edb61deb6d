"""Triton's reshape (``plaza.reshape``): shapes filled from element counts, the config's
checks, requests that cannot fit, and the runner handing the model its own shapes."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from plaza.client import make_request
from plaza.contract import InferRequest
from plaza.errors import ConfigError, InvalidInput
from plaza.loadgen.inputs import model_inputs
from plaza.loadgen.profiler import measure_curve
from plaza.modelconfig import ModelSpec, parse_model_config
from plaza.reshape import consistent, fill, reshape
from plaza.tensors import Tensor
from plaza.validation import validate_request
from plaza.workers.backends.base import Answer
from plaza.workers.runner import BatchRunner, WorkItem


@pytest.mark.parametrize(
    ("target", "elements", "filled"),
    [
        ((), 1, ()),
        ((), 2, None),
        ((2, 3), 6, (2, 3)),
        ((2, 3), 5, None),
        ((-1,), 7, (7,)),
        ((2, -1), 8, (2, 4)),
        ((2, -1), 7, None),
        ((-1, 4), 0, (0, 4)),
    ],
)
def test_fill_settles_the_one_free_dim_from_the_element_count(
    target: tuple[int, ...], elements: int, filled: tuple[int, ...] | None
) -> None:
    assert fill(target, elements) == filled


def test_reshape_keeps_the_batch_dim_of_a_batching_model() -> None:
    assert reshape((5, 1), (), batched=True) == (5,)
    assert reshape((5,), (1,), batched=True) == (5, 1)
    assert reshape((3, 2, 4), (-1, 2), batched=True) == (3, 4, 2)
    assert reshape((3, 2, 3), (4,), batched=True) is None
    assert reshape((2, 3), (6,), batched=False) == (6,)
    assert reshape((), (1,), batched=True) is None


def test_consistent_refuses_what_no_request_could_fit() -> None:
    assert consistent((1,), ()) is None
    assert consistent((-1,), (-1, 2)) is None  # settled per request
    assert consistent((4,), (-1, 2)) is None
    assert "one -1 at most" in str(consistent((4,), (-1, -1)))
    assert "cannot hold the 3 elements" in str(consistent((3,), (2,)))


def config(
    input_extra: str = "", output_extra: str = "", platform: str = "onnxruntime_onnx"
) -> ModelSpec:
    text = f"""
    name: "m" platform: "{platform}" max_batch_size: 8
    input [ {{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] {input_extra} }} ]
    output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] {output_extra} }} ]
    """
    return parse_model_config(text, source="m/config.pbtxt", default_name="m")


def test_the_config_keeps_each_tensors_reshape() -> None:
    spec = config("reshape: { shape: [ -1, 2 ] }", "reshape: { shape: [ ] }")
    assert spec.inputs[0].reshape == (-1, 2)
    assert spec.outputs[0].reshape == ()
    assert config().inputs[0].reshape is None


@pytest.mark.parametrize(
    ("input_extra", "output_extra", "field", "why"),
    [
        ("reshape: { shape: [ -1, -1 ] }", "", "input[0].reshape", "one -1 at most"),
        ("reshape: { shape: [ 0 ] }", "", "input[0].reshape", "-1 or positive"),
        ("", "reshape: { shape: [ 2 ] }", "output[0].reshape", "cannot hold the 2 elements"),
    ],
)
def test_a_reshape_no_request_could_fit_is_a_bad_config(
    input_extra: str, output_extra: str, field: str, why: str
) -> None:
    with pytest.raises(ConfigError) as info:
        config(input_extra, output_extra)
    assert f"field '{field}'" in info.value.message and why in info.value.message


def test_an_ensemble_may_not_reshape() -> None:
    with pytest.raises(ConfigError, match=r"'input\[0\].reshape': is not supported"):
        config("reshape: { shape: [ -1 ] }", platform="ensemble")


def test_a_request_whose_free_dim_cannot_be_reshaped_is_invalid() -> None:
    spec = config("reshape: { shape: [ -1, 2 ] }")
    fits = make_request("m", {"x": np.zeros((3, 4), np.float32)})
    assert validate_request(fits, spec) == 3
    odd = make_request("m", {"x": np.zeros((3, 5), np.float32)})
    with pytest.raises(InvalidInput, match=r"shape \[3, 5\] cannot be reshaped to the model's"):
        validate_request(odd, spec)


class Recorder:
    """A backend that answers y = the sum of each row of x, in the model's own shapes
    ([batch] for y), and remembers the shapes of x it was given."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, ...]] = []

    def infer(self, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
        x = inputs["x"]
        self.seen.append(x.shape)
        return {"y": x.reshape(x.shape[0], -1).sum(axis=1)}


def test_the_model_gets_its_shapes_and_the_clients_get_theirs() -> None:
    spec = config("reshape: { shape: [ -1, 2 ] }", "reshape: { shape: [ ] }")
    backend = Recorder()
    runner = BatchRunner(spec, {1: backend})  # type: ignore[dict-item]
    items = [
        WorkItem(make_request("m", {"x": np.full((rows, 4), v, np.float32)}), rows, 1)
        for v, rows in ((1.0, 1), (2.0, 2))
    ]
    results = asyncio.run(runner.run(items))
    assert backend.seen == [(3, 2, 2)]  # [batch] + reshape, the -1 settled to 2
    assert [r.output("y").shape for r in results] == [(1, 1), (2, 1)]  # [rows] + dims
    assert [r.output("y").to_numpy().ravel().tolist() for r in results] == [[4.0], [8.0, 8.0]]


def test_an_output_that_dims_cannot_hold_is_a_model_error() -> None:
    spec = config("", "reshape: { shape: [ ] }")

    class Wide(Recorder):
        def infer(self, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
            return {"y": np.zeros((inputs["x"].shape[0], 3), np.float32)}

    runner = BatchRunner(spec, {1: Wide()})  # type: ignore[dict-item]
    item = WorkItem(make_request("m", {"x": np.zeros((1, 2), np.float32)}), 1, 1)
    (result,) = asyncio.run(runner.run([item]))
    assert result.error is not None and result.error.code == "model_error"
    assert "cannot be reshaped to [1] (config.pbtxt reshape)" in result.error.message


class RowSums:
    """A backend that takes requests (as Triton's Python backend does): y = each row's sum,
    in the model's shape [rows]; it remembers the shapes of x it was given."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, ...]] = []

    def execute_requests(self, requests: Sequence[InferRequest]) -> list[Answer]:
        answers: list[Answer] = []
        for req in requests:
            (x,) = req.inputs
            self.seen.append(x.shape)
            rows = x.to_numpy()
            answers.append((Tensor.from_numpy("y", rows.reshape(rows.shape[0], -1).sum(1)),))
        return answers


def test_a_request_backend_gets_the_models_shapes_too() -> None:
    spec = config("reshape: { shape: [ -1, 2 ] }", "reshape: { shape: [ ] }")
    backend = RowSums()
    runner = BatchRunner(spec, {1: backend})  # type: ignore[dict-item]
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    (result,) = asyncio.run(runner.run([WorkItem(make_request("m", {"x": x}), 2, 1)]))
    assert backend.seen == [(2, 2, 2)]
    assert result.output("y").shape == (2, 1)
    assert result.output("y").to_numpy().ravel().tolist() == [6.0, 22.0]


def test_the_profiler_calls_a_backend_in_the_models_shapes() -> None:
    """The profiler runs the backend itself (no runner): it reshapes its made-up inputs."""
    spec = config("reshape: { shape: [ -1, 2 ] }")
    backend = Recorder()
    curve = measure_curve(backend, spec, [3], seq_len=4, rounds=1, window_s=0.0, min_calls=1)  # type: ignore[arg-type]
    assert [p.batch_size for p in curve] == [3]
    assert set(backend.seen) == {(3, 2, 2)}
    assert model_inputs(spec, 3, 4, np.random.default_rng(0))["x"].shape == (3, 2, 2)
