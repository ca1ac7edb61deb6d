"""The generate extension's fixes (review 2): a nested input of the wrong shape is refused,
not reshaped; an output never replaces the gateway's fields; a stream relay closed while it
waits leaves no task pending."""

from __future__ import annotations

import asyncio
import logging
import uuid

import numpy as np
import pytest

from plaza.contract import InferResult
from plaza.errors import InvalidInput
from plaza.gateway.generate import decode_generate_request, generate_response
from plaza.gateway.http_front import _relay
from plaza.modelconfig import ModelSpec, parse_model_config
from plaza.tensors import Tensor

_MATRIX = """
name: "matrix"
backend: "python"
max_batch_size: {batch}
input [
  {{ name: "M" data_type: TYPE_FP32 dims: [ 2, -1 ] }},
  {{ name: "V" data_type: TYPE_INT32 dims: [ 4 ] optional: true }},
  {{ name: "S" data_type: TYPE_STRING dims: [ -1, 2 ] optional: true }}
]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
"""


def _spec(batch: int = 0) -> ModelSpec:
    return parse_model_config(_MATRIX.format(batch=batch), source="t", default_name="matrix")


def _input(doc: dict[str, object], batch: int = 0) -> Tensor:
    front, _ = decode_generate_request(doc, _spec(batch))
    return front.inputs[0]


def _refused(doc: dict[str, object], batch: int = 0) -> str:
    with pytest.raises(InvalidInput) as caught:
        decode_generate_request(doc, _spec(batch))
    assert caught.value.code == "invalid_input"
    return str(caught.value)


def test_a_nested_list_of_the_dims_shape_keeps_it() -> None:
    m = _input({"M": [[1, 2, 3], [4, 5, 6]]})
    assert m.shape == (2, 3) and m.to_numpy().tolist() == [[1, 2, 3], [4, 5, 6]]


def test_a_flat_list_or_a_scalar_still_fills_the_dims() -> None:
    assert _input({"M": [1, 2, 3, 4, 5, 6]}).shape == (2, 3)
    assert _input({"V": [1, 2, 3, 4]}).shape == (4,)
    assert _input({"M": [1, 2]}, batch=4).shape == (1, 2, 1)


@pytest.mark.parametrize(
    ("value", "given"),
    [
        ([[1, 2], [3, 4], [5, 6]], "[3, 2]"),  # spread, it reached the model as 2x3
        ([[1, 2, 3, 4]], "[1, 4]"),
        ([[[1], [2]], [[3], [4]]], "[2, 2, 1]"),  # 3-D for a 2-D input
    ],
)
def test_a_nested_list_of_another_shape_is_refused_not_reshaped(value: object, given: str) -> None:
    words = _refused({"M": value})
    assert f"shape {given}" in words and "dims [2, -1]" in words and "'M'" in words


def test_a_batching_model_takes_a_leading_batch_of_one_and_nothing_else() -> None:
    m = _input({"M": [[[1, 2, 3], [4, 5, 6]]]}, batch=4)
    assert m.shape == (1, 2, 3) and m.to_numpy().tolist() == [[[1, 2, 3], [4, 5, 6]]]
    assert _input({"V": [[1, 2, 3, 4]]}, batch=4).shape == (1, 4)
    words = _refused({"M": [[1, 2], [3, 4], [5, 6]]}, batch=4)
    assert "shape [3, 2]" in words and "[1, 2, -1] with the batch dim" in words
    assert "shape [2, 2]" in _refused({"V": [[1, 2], [3, 4]]}, batch=4)
    assert "shape [1, 4]" in _refused({"V": [[1, 2, 3, 4]]})  # no batch dim: not batching


@pytest.mark.parametrize(
    "doc",
    [
        {"M": [[1, 2], [3]]},
        {"M": [[1, 2], [3, [4]]]},
        {"M": [[1, 2], 3]},
        # ragged but with as many values as its first items' shape needs (3x2)
        {"S": [["a", "b"], ["c"], ["d", "e", "f"]]},
    ],
)
def test_a_ragged_list_is_refused_in_generate_words(doc: dict[str, object]) -> None:
    words = _refused(doc)
    assert "ragged" in words and "'data'" not in words


def _result(*names: str, model: str = "named") -> InferResult:
    outputs = tuple(Tensor.from_numpy(n, np.array([7], np.int32)) for n in names)
    return InferResult("r1", model, "1", outputs=outputs)


def test_an_output_never_replaces_the_gateways_fields(caplog: pytest.LogCaptureFixture) -> None:
    """As Triton's answer (a map that keeps the first of a name): its fields, then the
    response's parameters, then the outputs."""
    model = f"named-{uuid.uuid4().hex[:8]}"  # logged once per process: a model of its own
    result = _result("model_name", "model_version", "id", "OUT", model=model)
    with caplog.at_level(logging.WARNING, logger="plaza.gateway.generate"):
        doc = generate_response(result, "mine")
        generate_response(result, "mine")
    assert doc == {"model_name": model, "model_version": "1", "id": "mine", "OUT": 7}
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 3  # once per output, not once per answer
    assert all("left out of generate answers" in m for m in logged)
    assert "'model_name'" in logged[0] and repr(model) in logged[0]


def test_an_output_named_id_is_written_when_the_client_gave_none() -> None:
    assert generate_response(_result("id"), None) == {
        "model_name": "named",
        "model_version": "1",
        "id": 7,
    }


class _Watched(asyncio.Queue[bytes]):
    """The app's parts, telling when the relay waits for one."""

    def __init__(self) -> None:
        super().__init__(4)
        self.waiting = asyncio.Event()

    async def get(self) -> bytes:
        self.waiting.set()
        return await super().get()


async def _between_two_events(never: asyncio.Event) -> None:
    await never.wait()


def _pending_gets() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if "_Watched.get" in repr(t.get_coro())]


async def test_a_relay_closed_while_it_waits_leaves_no_get_pending() -> None:
    """The client goes away between two events: the relay stops the app's call and its own
    wait for the next part (it left a pending ``Queue.get`` task per stream)."""
    parts = _Watched()
    done = asyncio.Event()
    call = asyncio.create_task(_between_two_events(asyncio.Event()))
    await parts.put(b"data: {}\n\n")
    relay = _relay(call, parts, done)
    assert await anext(relay) == b"data: {}\n\n"
    parts.waiting.clear()
    reading = asyncio.create_task(anext(relay))  # as the server's pump reads the stream
    await parts.waiting.wait()  # the relay waits for the next part
    assert len(_pending_gets()) == 1
    reading.cancel()  # the client went away
    await asyncio.gather(reading, return_exceptions=True)
    await relay.aclose()
    assert call.cancelled() and done.is_set()
    assert _pending_gets() == []
