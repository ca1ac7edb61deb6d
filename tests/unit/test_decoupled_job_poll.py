"""A decoupled model's job as its poll renders it: binary outputs where asked, and a
response that JSON cannot carry rendered as its error without losing the others."""

from __future__ import annotations

import numpy as np
import orjson

from plaza.contract import ErrorInfo, InferResult
from plaza.gateway.app import _decoupled_job
from plaza.results import JobStatus
from plaza.tensors import Tensor

RAW = b"\xff\xfe\x00raw"


def _response(index: int, *items: bytes, final: bool = False) -> InferResult:
    tensor = Tensor.from_numpy("S", np.array(list(items), dtype=object))
    return InferResult("j", "m", "1", outputs=(tensor,), index=index, final=final)


def _status(*responses: InferResult) -> JobStatus:
    return JobStatus("done", responses[-1], responses, decoupled=True)


def test_a_response_json_cannot_carry_is_its_error_and_the_others_stand() -> None:
    body = _decoupled_job(
        "j",
        _status(_response(0, b"a"), _response(1, RAW), _response(2, b"c", final=True)),
        lambda _: False,
    )
    assert body.header_length is None
    doc = orjson.loads(body.content)
    assert doc["status"] == "done"
    first, bad, last = doc["responses"]
    assert first["outputs"][0]["data"] == ["a"] and last["outputs"][0]["data"] == ["c"]
    assert bad["code"] == "invalid_input" and "not valid UTF-8" in bad["error"]


def test_binary_outputs_follow_the_header_in_order() -> None:
    responses = (_response(0, b"a"), _response(1, RAW), _response(2, b"c", final=True))
    body = _decoupled_job("j", _status(*responses), lambda _: True)
    assert body.header_length is not None
    doc = orjson.loads(body.content[: body.header_length])
    sizes = [r["outputs"][0]["parameters"]["binary_data_size"] for r in doc["responses"]]
    tail = body.content[body.header_length :]
    assert sizes == [len(r.outputs[0].data) for r in responses]
    assert tail == b"".join(bytes(r.outputs[0].data) for r in responses)


def test_an_error_final_response_is_the_jobs_with_binary_before_it() -> None:
    final = InferResult("j", "m", "1", error=ErrorInfo("model_error", "boom"), index=1, final=True)
    body = _decoupled_job("j", _status(_response(0, RAW), final), lambda _: True)
    assert body.header_length is not None
    doc = orjson.loads(body.content[: body.header_length])
    assert (doc["status"], doc["code"]) == ("error", "model_error")
    assert len(doc["responses"]) == 1
    assert body.content.endswith(RAW)
