"""loadgen's KServe v2 bodies, read back by the gateway's own decoder; the private lane."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from starlette.testclient import TestClient

from plaza.contract import InferResult
from plaza.gateway.kserve import decode_infer_request, encode_infer_response
from plaza.loadgen.http_client import (
    HEADER_INFERENCE_LENGTH,
    binary_request,
    json_request,
    response_header,
)
from plaza.loadgen.inputs import input_pool, sentences, synthetic_pool
from plaza.modelconfig import parse_model_config
from plaza.tensors import Tensor

ROOT = Path(__file__).resolve().parents[2]
INPUTS = {
    "INPUT0": np.arange(32, dtype=np.int32).reshape(2, 16),
    "INPUT1": np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3),
}


def _decoded(body: bytes, headers: dict[str, str]) -> dict[str, np.ndarray]:
    length = headers.get(HEADER_INFERENCE_LENGTH)
    decoded = decode_infer_request(body, int(length) if length else None)
    return {t.name: t.to_numpy() for t in decoded.inputs}


@pytest.mark.parametrize("encode", [json_request, binary_request])
def test_bodies_decode_to_the_same_tensors(encode: object) -> None:
    req = encode(INPUTS)  # type: ignore[operator]
    got = _decoded(req.body, req.headers)
    assert got.keys() == INPUTS.keys()
    for name, array in INPUTS.items():
        np.testing.assert_array_equal(got[name], array)
        assert got[name].dtype == array.dtype


def test_binary_request_asks_for_binary_outputs() -> None:
    req = binary_request(INPUTS)
    header = decode_infer_request(req.body, int(req.headers[HEADER_INFERENCE_LENGTH]))
    assert header.binary_output is True
    assert json_request(INPUTS).headers["Content-Type"] == "application/json"


def test_response_header_reads_json_and_binary_responses() -> None:
    out = np.ones((2, 4), dtype=np.float32)
    result = InferResult("id", "m", "1", outputs=(Tensor.from_numpy("OUT", out),))
    binary = encode_infer_response(result, response_id="id", binary=lambda _: True)
    headers = {HEADER_INFERENCE_LENGTH: str(binary.header_length)}
    assert response_header(binary.content, headers)["outputs"][0]["name"] == "OUT"
    plain = encode_infer_response(result, response_id="id", binary=lambda _: False)
    assert response_header(plain.content, {})["outputs"][0]["data"] == [1.0] * 8


def test_input_pools_follow_the_config() -> None:
    spec = parse_model_config(
        'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] }]\n'
        'output [{ name: "y" data_type: TYPE_FP32 dims: [ -1 ] }]\n',
        source="m/config.pbtxt",
        default_name="m",
    )
    pool = synthetic_pool(spec, rows=3, seq_len=5, count=4)
    assert len(pool) == 4 and pool[0]["x"].shape == (3, 5)
    assert not np.array_equal(pool[0]["x"], pool[1]["x"])
    assert input_pool(spec, count=2)[0]["x"].shape == (1, 16)
    assert len(set(sentences(10))) > 1


def test_private_lane_answers_kserve_json(tmp_path: Path) -> None:
    source = ROOT / "model_repository" / "identity"
    if not (source / "1" / "model.onnx").is_file():
        pytest.skip("identity is not built (make models)")
    shutil.copytree(source, tmp_path / "identity")
    from plaza.loadgen.baseline_server import create_app

    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    req = json_request({"INPUT0": x})
    with TestClient(create_app(tmp_path, "identity", threads=1)) as client:
        resp = client.post("/v2/models/identity/infer", content=req.body, headers=req.headers)
        assert client.get("/v2/health/ready").status_code == 200
    assert resp.status_code == 200
    out = resp.json()["outputs"][0]
    assert out["name"] == "OUTPUT0" and out["shape"] == [2, 4]
    assert out["data"] == x.reshape(-1).tolist()
