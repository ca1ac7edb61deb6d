"""What a producer of its own may put in a record, and what becomes of the rest.

- ``parameters`` hold names to scalars (bool, int, float, str), as the fronts and Triton's
  parameters do; anything else is a bad_envelope naming the parameter.
- ``peek_reply`` reads the correlation id (and reply stream) of a record that failed to
  decode wherever msgpack holds one, so that record is answered, not dead-lettered.
- The Python model's process hands each request to the model on its own: one it cannot
  hand over is answered with its error alone, never failing its batch-mates.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import pytest

from plaza.codec import decode_request, decode_result, encode_request, peek_reply
from plaza.contract import InferRequest, InferResult
from plaza.errors import CodecError
from plaza.tensors import Tensor
from plaza.workers.backends import pb_utils
from plaza.workers.backends.python_stub import ModelHost

STREAM = "plaza:replies:gw"


def envelope(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "v": 1,
        "id": "r1",
        "model": "m",
        "version": "",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": b"\0" * 4}],
    }
    body.update(fields)
    return body


def packed(**fields: Any) -> bytes:
    return msgpack.packb(envelope(**fields), use_bin_type=True, datetime=False)


# -- parameters ---------------------------------------------------------------------------


def test_scalar_parameters_travel_as_they_are() -> None:
    params = {"b": True, "i": -(2**63), "u": 2**64 - 1, "f": 0.25, "s": "text", "e": ""}
    req = decode_request(packed(parameters=params))
    assert req.parameters == params
    assert [type(v) for v in req.parameters.values()] == [bool, int, int, float, str, str]
    assert decode_request(encode_request(req)).parameters == params


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"k": b"\x01"}, "parameter 'k': a value must be a bool, an int, a float or a string"),
        ({"k": None}, "parameter 'k': a value must be"),
        ({"k": {"a": [1]}}, "parameter 'k': a value must be"),
        ({"k": [1, 2]}, "parameter 'k': a value must be"),
        ({"k": msgpack.ExtType(5, b"x")}, "parameter 'k': a value must be"),
        ({"k": msgpack.Timestamp(1, 0)}, "parameter 'k': a value must be"),
        ({b"k": 1}, "parameter b'k': a name must be a string"),
        ({"k": {1: "x"}}, "not valid msgpack"),  # a map key that is not a string, anywhere
    ],
)
def test_parameters_that_are_not_scalars_are_a_bad_envelope_naming_them(
    params: dict[Any, Any], words: str
) -> None:
    with pytest.raises(CodecError) as info:
        decode_request(packed(parameters=params))
    assert info.value.code == "bad_envelope"
    assert words in info.value.message


# -- peek_reply ---------------------------------------------------------------------------


def nested(depth: int) -> bytes:
    """``envelope()`` with a ``parameters`` map ``depth`` maps deep as its last entry."""
    head = packed(reply_stream=STREAM)
    return (
        bytes([head[0] + 1])
        + head[1:]
        + msgpack.packb("parameters")
        + b"\x81\xa1a" * depth
        + b"\xc0"
    )


def nested_before_id() -> bytes:
    """A map whose first value is nested past msgpack's depth, its id after it."""
    deep = b"\x81\xa1a" * 5000 + b"\xc0"
    return b"\x82" + msgpack.packb("deep") + deep + msgpack.packb("id") + msgpack.packb("r1")


@pytest.mark.parametrize(
    ("case", "data"),
    [
        ("bytes after the map", packed(reply_stream=STREAM) + b"\x00"),
        ("another map after it", packed(reply_stream=STREAM) + packed(id="r2")),
        ("a map key that is an int", packed(reply_stream=STREAM, parameters={"m": {1: "x"}})),
        ("an int key at the top", msgpack.packb({**envelope(reply_stream=STREAM), 7: 1})),
        ("nested past msgpack's depth", nested(5000)),
        ("nested past msgspec's depth", nested(1000)),
    ],
)
def test_a_record_that_does_not_decode_is_answerable_where_its_id_can_be_read(
    case: str, data: bytes
) -> None:
    with pytest.raises(CodecError):  # refused, with the project's error, whatever the fault
        decode_request(data)
    assert peek_reply(data) == ("r1", STREAM), case


@pytest.mark.parametrize(
    ("case", "data"),
    [
        ("not msgpack", b"\xc1\xc1"),
        ("truncated", packed()[:-3]),
        ("empty", b""),
        ("not a map", msgpack.packb([1, 2])),
        ("no id", msgpack.packb({k: v for k, v in envelope().items() if k != "id"})),
        ("an id that is not a string", packed(id=5)),
        ("an empty id", packed(id="")),
        ("nested past the reader before its id", nested_before_id()),
    ],
)
def test_a_record_without_a_readable_id_has_none(case: str, data: bytes) -> None:
    assert peek_reply(data)[0] is None, case


# -- the Python model's process -----------------------------------------------------------


class Pipe:
    """The stub's end of its channel to the worker: what it sends is kept."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    def readable(self) -> bool:
        return False  # no cancels


class Echo:
    """A model whose OUT is each request's x; decoupled, it answers through the senders."""

    def __init__(self, decoupled: bool) -> None:
        self.decoupled = decoupled
        self.given: list[str] = []

    def execute(self, requests: list[pb_utils.InferenceRequest]) -> Any:
        self.given += [r.request_id() for r in requests]
        responses = [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", r.inputs()[0].as_numpy())])
            for r in requests
        ]
        if not self.decoupled:
            return responses
        for r, response in zip(requests, responses, strict=True):
            final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            r.get_response_sender().send(response, flags=final)
        return None


def host(decoupled: bool) -> tuple[ModelHost, Echo, Pipe]:
    made, model, pipe = ModelHost(), Echo(decoupled), Pipe()
    made.model, made.name, made.version, made.outputs = model, "echo", 1, ["OUT"]
    made.decoupled, made.channel = decoupled, pipe
    return made, model, pipe


def batch() -> list[bytes]:
    """Three requests; the middle one names a version the process cannot read (the worker
    never sends one: it stands for any request the model cannot be given)."""
    x = Tensor.from_numpy("x", np.array([1.0, 2.0], np.float32))
    reqs = [InferRequest(rid, "echo", v, (x,)) for rid, v in [("a", ""), ("b", "x"), ("c", "1")]]
    return [encode_request(r) for r in reqs]


def check(results: list[InferResult], model: Echo) -> None:
    assert [r.id for r in results] == ["a", "b", "c"]
    bad = results[1].error
    assert bad is not None and bad.code == "invalid_input" and "'b'" in bad.message
    for good in (results[0], results[2]):
        assert good.error is None
        np.testing.assert_array_equal(good.output("OUT").to_numpy(), [1.0, 2.0])
    assert model.given == ["a", "c"]


def test_a_request_that_cannot_be_given_to_the_model_fails_alone() -> None:
    made, model, _ = host(decoupled=False)
    answer = made.execute(batch())
    assert "error" not in answer, answer.get("error")
    check([decode_result(r) for r in answer["results"]], model)


def test_a_decoupled_models_request_that_cannot_be_given_to_it_is_closed_alone() -> None:
    made, model, pipe = host(decoupled=True)
    assert made.execute_decoupled(batch()) == {"ok": True}
    by_request = {f["response"]: f for f in pipe.sent}
    assert sorted(by_request) == [0, 1, 2] and all(f["final"] for f in pipe.sent)
    check([decode_result(by_request[i]["result"]) for i in range(3)], model)
