"""Triton's generate extension as the gateway reads and writes it (``plaza.gateway.generate``):
a JSON object whose top-level keys are the model's inputs and parameters, and an answer that
holds each output by name."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from plaza.contract import InferResult
from plaza.errors import InvalidInput
from plaza.gateway.generate import decode_generate_request, generate_response, sse_event
from plaza.modelconfig import ModelSpec, parse_model_config
from plaza.tensors import Tensor

_LLM = """
name: "llm"
backend: "python"
max_batch_size: 4
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
  { name: "bias" data_type: TYPE_FP32 dims: [ 2, -1 ] optional: true }
]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
"""


def _spec(text: str = _LLM) -> ModelSpec:
    return parse_model_config(text, source="t", default_name="llm")


def test_inputs_by_name_and_the_rest_as_parameters() -> None:
    doc = {
        "text_input": "hello",
        "max_tokens": 16,
        "bias": [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]],
        "temperature": 0.5,
        "parameters": {"stream": False, "timeout": 2_000_000},
        "id": "mine",
    }
    front, client_id = decode_generate_request(doc, _spec())
    by_name = {t.name: t for t in front.inputs}
    assert by_name["text_input"].shape == (1, 1)
    assert by_name["text_input"].to_numpy().tolist() == [[b"hello"]]
    assert by_name["max_tokens"].datatype == "INT32"
    assert by_name["max_tokens"].to_numpy().tolist() == [[16]]
    assert by_name["bias"].shape == (1, 2, 3)  # its nesting fits dims [2, -1]
    assert front.parameters == {"stream": False, "temperature": 0.5}
    assert front.timeout_us == 2_000_000 and client_id == "mine"


def test_flat_values_fill_the_dims() -> None:
    front, _ = decode_generate_request({"text_input": "x", "bias": [1, 2, 3, 4]}, _spec())
    bias = next(t for t in front.inputs if t.name == "bias")
    assert bias.shape == (1, 2, 2) and bias.to_numpy().tolist() == [[[1.0, 2.0], [3.0, 4.0]]]
    plain = _spec(_LLM.replace("max_batch_size: 4", "max_batch_size: 0"))
    front, _ = decode_generate_request({"text_input": ["a"]}, plain)
    assert front.inputs[0].shape == (1,)  # no batch dim without batching


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ([1, 2], "must be a JSON object"),
        ({"text_input": "x", "bias": [1, 2, 3]}, "3 values do not fit its dims [2, -1]"),
        ({"text_input": "x", "nope": [1]}, "'nope' is not an input of model 'llm'"),
        ({"text_input": "x", "t": 1, "parameters": {"t": 2}}, "nor a parameter"),
        ({"text_input": 5}, "BYTES data must be strings"),
        ({"text_input": "x", "max_tokens": 2**40}, "out of range for INT32"),
        ({"text_input": "x", "bias": [[1, 2], [3]]}, "'bias'"),
        ({"text_input": "x", "id": 7}, "'id' must be a string"),
        ({"text_input": "x", "shared_memory_region": "r"}, "is not supported by Plaza"),
    ],
)
def test_bad_bodies_are_clear_errors(doc: object, words: str) -> None:
    with pytest.raises(InvalidInput, match=words.replace("[", r"\[").replace("]", r"\]")):
        decode_generate_request(doc, _spec())


def test_the_answer_holds_each_output_by_name() -> None:
    text = Tensor.from_numpy("text_output", np.array([[b"hi there"]], dtype=object))
    scores = Tensor.from_numpy("scores", np.array([[0.5, 0.25]], np.float32))
    result = InferResult("r1", "llm", "1", outputs=(text, scores))
    doc = generate_response(result, "mine")
    assert doc == {
        "model_name": "llm",
        "model_version": "1",
        "id": "mine",
        "text_output": "hi there",  # one value: the value itself
        "scores": [0.5, 0.25],
    }
    event = sse_event(doc)
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert orjson.loads(event[len(b"data: ") : -2]) == doc


def test_the_answer_holds_the_responses_parameters_as_top_level_keys() -> None:
    """As Triton's generate answers them: beside the outputs; a parameter never replaces
    ``model_name``, ``model_version`` or ``id``, and wins over an output of its name."""
    text = Tensor.from_numpy("text_output", np.array([[b"hi"]], dtype=object))
    clash = Tensor.from_numpy("b", np.array([[5]], np.int32))
    params = {"a": 1, "b": "x", "c": True, "model_name": "not it", "id": "nor this"}
    result = InferResult("r1", "llm", "1", outputs=(text, clash), parameters=params)
    assert generate_response(result, "mine") == {
        "model_name": "llm",
        "model_version": "1",
        "id": "mine",
        "a": 1,
        "b": "x",
        "c": True,
        "text_output": "hi",
    }
    assert generate_response(result, None)["id"] == "nor this"  # no id of the client's
    plain = generate_response(InferResult("r1", "llm", "1", outputs=(text,)), None)
    assert plain == {"model_name": "llm", "model_version": "1", "text_output": "hi"}


def test_a_bytes_output_that_is_not_utf8_is_replaced_not_refused() -> None:
    """generate has no binary form, and a byte-level tokenizer's streamed responses may each
    hold part of one character: the stream goes on (infer's JSON refuses such bytes)."""
    text = Tensor.from_numpy("text_output", np.array([[b"caf\xc3"]], dtype=object))
    doc = generate_response(InferResult("r1", "llm", "1", outputs=(text,)), None)
    assert doc["text_output"] == "caf\ufffd"
