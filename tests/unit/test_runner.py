"""The batch runner with a fake backend: stacking, splitting, shape groups, isolated failures."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import numpy as np

from plaza.client import make_request
from plaza.modelconfig import parse_model_config
from plaza.workers.runner import BatchRunner, WorkItem, stack_inputs

SPEC = parse_model_config(
    """
    name: "m" platform: "onnxruntime_onnx" max_batch_size: 16
    input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]
    output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]
    """,
    source="m/config.pbtxt",
    default_name="m",
)


class Doubler:
    """A backend that doubles its input and remembers the batch shapes it saw."""

    def __init__(self, fail_when: float | None = None) -> None:
        self.calls: list[tuple[int, ...]] = []
        self.fail_when = fail_when

    def infer(self, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
        x = inputs["x"]
        self.calls.append(x.shape)
        if self.fail_when is not None and (x == self.fail_when).any():
            raise RuntimeError("poisoned batch")
        return {"y": x * 2}


def item(value: float, rows: int = 1, width: int = 3) -> WorkItem:
    req = make_request("m", {"x": np.full((rows, width), value, np.float32)})
    return WorkItem(request=req, rows=rows, version=1)


def run(runner: BatchRunner, items: list[WorkItem]):
    return asyncio.run(runner.run(items))


def test_batch_is_stacked_once_and_split_back_per_request() -> None:
    backend = Doubler()
    runner = BatchRunner(SPEC, {1: backend}, worker_id="w")  # type: ignore[dict-item]
    results = run(runner, [item(1), item(2, rows=3), item(3)])
    assert backend.calls == [(5, 3)]
    assert [r.output("y").to_numpy().tolist() for r in results] == [
        [[2, 2, 2]],
        [[4, 4, 4]] * 3,
        [[6, 6, 6]],
    ]
    assert all(r.worker == "w" and r.timing_us["compute_infer"] >= 0 for r in results)


def test_requests_with_different_shapes_run_as_separate_sub_batches() -> None:
    backend = Doubler()
    runner = BatchRunner(SPEC, {1: backend})  # type: ignore[dict-item]
    results = run(runner, [item(1, width=3), item(2, width=5), item(3, width=3)])
    assert sorted(backend.calls) == [(1, 5), (2, 3)]
    assert [r.output("y").to_numpy().shape for r in results] == [(1, 3), (1, 5), (1, 3)]


def test_a_failing_request_fails_alone_and_its_batch_mates_are_answered() -> None:
    backend = Doubler(fail_when=9.0)
    runner = BatchRunner(SPEC, {1: backend})  # type: ignore[dict-item]
    results = run(runner, [item(9, width=4), item(1, width=3), item(2, width=4)])
    assert [r.status for r in results] == ["error", "ok", "ok"]
    assert results[0].error is not None and results[0].error.code == "model_error"
    assert "poisoned batch" in results[0].error.message
    assert results[2].output("y").to_numpy().tolist() == [[4, 4, 4, 4]]
    again = run(runner, [item(4), item(5)])
    assert [r.status for r in again] == ["ok", "ok"]


def test_bisection_finds_one_culprit_among_many_in_few_calls() -> None:
    backend = Doubler(fail_when=9.0)
    runner = BatchRunner(SPEC, {1: backend})  # type: ignore[dict-item]
    values = [float(v) for v in range(16)]  # 9.0 is the poisoned one
    results = run(runner, [item(v) for v in values])
    assert [r.status for r in results] == ["error" if v == 9 else "ok" for v in values]
    assert [r.output("y").to_numpy()[0, 0] for r in results if r.error is None] == [
        2 * v for v in values if v != 9
    ]
    # 1 failed call of 16, then halves down to the culprit: 2 per level, 4 levels
    assert len(backend.calls) == 1 + 2 * 4


def test_every_request_failing_still_answers_each_with_an_error() -> None:
    class Broken(Doubler):
        def infer(self, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
            raise RuntimeError("model is broken")

    results = run(BatchRunner(SPEC, {1: Broken()}), [item(v) for v in range(5)])  # type: ignore[dict-item]
    assert [r.error.code if r.error else "ok" for r in results] == ["model_error"] * 5


def test_wrong_output_rows_is_a_model_error_not_a_crash() -> None:
    class Truncating(Doubler):
        def infer(self, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
            return {"y": inputs["x"][:0]}  # wrong for any batch, even of one request

    runner = BatchRunner(SPEC, {1: Truncating()})  # type: ignore[dict-item]
    results = run(runner, [item(1), item(2)])
    assert [r.error.code if r.error else "ok" for r in results] == ["model_error"] * 2


def test_a_backend_takes_requests_as_the_protocol_says() -> None:
    from plaza.workers.backends.base import RequestBackend, takes_requests
    from plaza.workers.backends.python_backend import PythonBackend
    from plaza.workers.backends.simulated import SimulatedBackend

    for cls in (PythonBackend, SimulatedBackend):
        backend = object.__new__(cls)  # the answer is the class's: nothing loaded
        assert takes_requests(backend) == isinstance(backend, RequestBackend)
    assert takes_requests(object.__new__(PythonBackend))
    assert not takes_requests(object.__new__(SimulatedBackend))


class NoDetections:
    """A backend whose output has no elements per row (a detector that found nothing)."""

    def infer(self, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
        return {"y": np.zeros((inputs["x"].shape[0], 0), np.float32)}


def test_an_output_with_no_elements_is_split_into_empty_answers() -> None:
    runner = BatchRunner(SPEC, {1: NoDetections()})  # type: ignore[dict-item]
    results = run(runner, [item(1), item(2, rows=2)])
    assert [r.error for r in results] == [None, None]
    assert [r.output("y").to_numpy().shape for r in results] == [(1, 0), (2, 0)]


class Annotating:
    """A request backend (as the Python backend is) whose answers carry response parameters
    for requests whose x is positive: outputs with parameters, a plain tuple, or an error."""

    def infer(self, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
        raise AssertionError("a request backend is handed requests")

    def execute_requests(self, requests: list[Any]) -> list[Any]:
        from plaza.errors import InvalidInput
        from plaza.tensors import Tensor
        from plaza.workers.backends.base import Response

        answers: list[Any] = []
        for req in requests:
            x = req.inputs[0].to_numpy()
            y = (Tensor.from_numpy("y", x * 2),)
            if (x > 0).all():
                answers.append(Response(y, {"a": 1, "b": "x", "c": True}))
            elif (x == 0).all():
                answers.append(y)
            else:
                answers.append(InvalidInput("negative"))
        return answers


def test_a_request_backends_response_parameters_reach_the_result() -> None:
    runner = BatchRunner(SPEC, {1: Annotating()}, worker_id="w")  # type: ignore[dict-item]
    annotated, plain, refused = run(runner, [item(1), item(0), item(-1)])
    assert annotated.parameters == {"a": 1, "b": "x", "c": True}
    assert annotated.output("y").to_numpy().tolist() == [[2, 2, 2]]
    assert annotated.worker == "w" and annotated.timing_us["compute_infer"] >= 0
    assert plain.parameters == {} and plain.error is None
    assert refused.error is not None and refused.parameters == {}


def test_response_parameters_survive_an_outputs_reshape() -> None:
    spec = parse_model_config(
        """
        name: "m" backend: "python" max_batch_size: 16
        input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] reshape: { shape: [ -1, 1 ] } } ]
        """,
        source="m/config.pbtxt",
        default_name="m",
    )

    class Columns(Annotating):
        """Answers y as the model's shape [rows, n, 1] (the client's: [rows, n])."""

        def execute_requests(self, requests: list[Any]) -> list[Any]:
            from plaza.tensors import Tensor

            answers = super().execute_requests(requests)
            for i, req in enumerate(requests):
                column = Tensor.from_numpy("y", req.inputs[0].to_numpy()[..., None] * 2)
                answers[i] = msgspec.structs.replace(answers[i], outputs=(column,))
            return answers

    (result,) = run(BatchRunner(spec, {1: Columns()}), [item(1)])  # type: ignore[dict-item]
    assert result.output("y").shape == (1, 3) and result.parameters == {"a": 1, "b": "x", "c": True}


def test_stacked_inputs_join_each_input_by_name_whatever_order_requests_list_them() -> None:
    two = parse_model_config(
        """
        name: "m2" platform: "onnxruntime_onnx" max_batch_size: 16
        input [ { name: "a" data_type: TYPE_INT32 dims: [ 2 ] },
                { name: "s" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "y" data_type: TYPE_INT32 dims: [ 2 ] } ]
        """,
        source="m2/config.pbtxt",
        default_name="m2",
    )
    a1, a2 = np.array([[1, 2]], np.int32), np.array([[3, 4], [5, 6]], np.int32)
    s1, s2 = np.array([["x"]], object), np.array([["y"], ["zz"]], object)
    first = make_request("m2", {"a": a1, "s": s1})
    second = make_request("m2", {"s": s2, "a": a2})  # its inputs in the other order
    items = [
        WorkItem(request=first, rows=1, version=1),
        WorkItem(request=second, rows=2, version=1),
    ]
    arrays = stack_inputs(items, two.max_batch_size > 0)
    np.testing.assert_array_equal(arrays["a"], np.concatenate([a1, a2]))
    assert arrays["a"].dtype == np.int32 and arrays["a"].flags.writeable
    assert arrays["s"].reshape(-1).tolist() == [b"x", b"y", b"zz"]
