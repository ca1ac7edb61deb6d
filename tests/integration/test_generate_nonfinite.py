"""generate and generate_stream read and write ``NaN``, ``Infinity`` and ``-Infinity`` as
infer does (Triton's rapidjson flags): a body with the tokens is a request, not a 400, and
an answer holds the tokens, not ``null``, whether an output is one value or a list.

Real Kafka and Redis: the gateway's own HTTP server, an ``identity`` worker (ONNX, FP32)
and ``spread``, a decoupled Python model that answers each element of its input as a
response of its own (the generate_stream events of a decoupled model).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import httpx
import pytest

from plaza.settings import PlazaSettings
from tests.python_models import write_model
from tests.support import gateway_fronts, running_worker

pytestmark = pytest.mark.timeout(180)

SPREAD_CONFIG = """
name: "spread"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""
SPREAD_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            for value in request.inputs()[0].as_numpy().reshape(-1):
                out = pb_utils.Tensor("OUT", np.array([value], np.float32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
            sender.send(flags=FINAL)
        return None
"""
TOKENS = b"[1.5,NaN,Infinity,-Infinity]"
"""The values as tritonclient (python-rapidjson) writes them, and Triton answers them."""


def _events(body: bytes) -> list[bytes]:
    """The ``data:`` payloads of a server-sent event stream."""
    return [e.removeprefix(b"data: ") for e in body.split(b"\n\n") if e]


def _same(values: list[float], expected: list[float]) -> bool:
    return all(
        (math.isnan(a) and math.isnan(b)) or a == b for a, b in zip(values, expected, strict=True)
    )


async def test_generate_reads_and_writes_the_tokens_as_infer(
    settings_for: Callable[..., PlazaSettings],
) -> None:
    settings = settings_for("identity")
    write_model(settings.repository, "spread", SPREAD_CONFIG, SPREAD_MODEL)
    infer_body = b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": '
    async with (
        running_worker(settings, "identity"),
        running_worker(settings, "spread"),
        gateway_fronts(settings) as gw,
        httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=60) as http,
    ):
        inferred = await http.post(
            "/v2/models/identity/infer", content=infer_body + TOKENS + b"}]}"
        )
        listed = await http.post("/v2/models/identity/generate", content=b'{"INPUT0": %s}' % TOKENS)
        alone = await http.post("/v2/models/identity/generate", content=b'{"INPUT0": -Infinity}')
        streamed = await http.post(
            "/v2/models/identity/generate_stream", content=b'{"INPUT0": %s}' % TOKENS
        )
        spread = await http.post(
            "/v2/models/spread/generate_stream", content=b'{"IN": %s}' % TOKENS
        )
        refused = await http.post("/v2/models/identity/generate", content=b'{"INPUT0": [nan]}')

    assert inferred.status_code == 200, inferred.text
    assert TOKENS in inferred.content  # what generate must match
    assert listed.status_code == 200, listed.text
    assert b'"OUTPUT0":' + TOKENS in listed.content  # not [1.5,null,null,null]
    assert _same(json.loads(listed.content)["OUTPUT0"], [1.5, math.nan, math.inf, -math.inf])
    assert alone.status_code == 200, alone.text
    assert b'"OUTPUT0":-Infinity' in alone.content  # one value: the value itself
    assert streamed.status_code == 200, streamed.text
    (event,) = _events(streamed.content)
    assert b'"OUTPUT0":' + TOKENS in event
    assert spread.status_code == 200, spread.text
    outs = [json.loads(e)["OUT"] for e in _events(spread.content)]
    assert _same(outs, [1.5, math.nan, math.inf, -math.inf])
    assert [e.rpartition(b'"OUT":')[2] for e in _events(spread.content)] == [
        b"1.5}",
        b"NaN}",
        b"Infinity}",
        b"-Infinity}",
    ]
    # other spellings are still malformed JSON, as for infer
    assert refused.status_code == 400 and refused.json()["code"] == "invalid_input"
