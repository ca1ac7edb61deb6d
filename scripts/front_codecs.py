"""The fronts' own message work per request, gRPC against HTTP JSON, one process.

    PYTHONPATH=. python scripts/front_codecs.py [--json PATH]     # from the repository root

For the sample mlp's request (one FP32 input of 512 values, one output of 10) it times what
each front's handler does besides publishing and waiting: gRPC: parse the
``ModelInferRequest`` bytes (grpcio does it before the handler), ``grpc_codec.
decode_infer_request`` and ``to_request``, ``grpc_codec.encode_infer_response`` and the
response's serialisation; HTTP: ``kserve.decode_infer_request`` of the JSON body,
``to_request``, ``kserve.encode_infer_response`` (JSON output). Prints microseconds a
request; what is left of a front's CPU per request in a benchmark is its server's and the
shared producer core's.
"""

from __future__ import annotations

import argparse
import json
import timeit
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from tritonclient.grpc import service_pb2 as pb

from plaza.contract import InferResult
from plaza.gateway import grpc_codec, kserve
from plaza.tensors import Tensor


def _best(fn: Any, number: int = 5000) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def measure(values: int = 512, outputs: int = 10) -> dict[str, float]:
    """Microseconds a request, by front and step."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, values)).astype(np.float32)
    result = InferResult(
        id="c",
        model="mlp",
        version="1",
        outputs=(Tensor.from_numpy("OUTPUT0", rng.standard_normal((1, outputs), np.float32)),),
    )
    msg = pb.ModelInferRequest(model_name="mlp", id="1")
    tensor = msg.inputs.add()
    tensor.name, tensor.datatype = "INPUT0", "FP32"
    tensor.shape.extend(x.shape)
    msg.outputs.add().name = "OUTPUT0"
    msg.raw_input_contents.append(x.tobytes())
    wire = msg.SerializeToString()
    body = orjson.dumps(
        {
            "id": "1",
            "inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [1, values], "data": x.tolist()}
            ],
            "outputs": [{"name": "OUTPUT0"}],
        }
    )

    def grpc_in() -> Any:
        request = pb.ModelInferRequest.FromString(wire)
        decoded = grpc_codec.decode_infer_request(request)
        return decoded.to_request("mlp", "", "c")

    def grpc_out() -> bytes:
        return bytes(grpc_codec.encode_infer_response(result, "1").SerializeToString())

    def http_in() -> Any:
        return kserve.decode_infer_request(memoryview(body)).request.to_request("mlp", "", "c")

    def http_out() -> Any:
        return kserve.encode_infer_response(result, response_id="1", binary=lambda name: False)

    out = {
        "grpc_request_us": _best(grpc_in),
        "grpc_response_us": _best(grpc_out),
        "http_json_request_us": _best(http_in),
        "http_json_response_us": _best(http_out),
    }
    out = {k: round(v, 2) for k, v in out.items()}
    out["grpc_us"] = round(out["grpc_request_us"] + out["grpc_response_us"], 2)
    out["http_json_us"] = round(out["http_json_request_us"] + out["http_json_response_us"], 2)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    out = measure()
    for name, us in out.items():
        print(f"{name:22s} {us:8.2f} us/request")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
