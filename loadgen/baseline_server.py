"""The private lane: a naive KServe v2 JSON server, one ONNX Runtime call per request.

What Plaza is compared against: Starlette + uvicorn (the same stack as Plaza's gateway),
one InferenceSession with ONNX Runtime's own defaults (as a new user writes it: spinning
threads), and no batching, no queue: each request's tensors are decoded from JSON, run on
their own in the event loop, and encoded back. It also answers the server and model
metadata, config and statistics requests (so Triton's perf_analyzer can drive it), and nothing else.

    python -m plaza.loadgen.baseline_server --model mlp --port 8100
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from plaza.datatypes import from_numpy_dtype, to_numpy_dtype
from plaza.loadgen.raw_backend import open_session
from plaza.repository import ModelRepository


def create_app(
    repository: Path, model: str, threads: int = 2, spinning: bool | None = None
) -> Starlette:
    """The app serving ``model``'s latest version at /v2/models/{model}/infer (``spinning``
    None: ONNX Runtime's default, on)."""
    repo = ModelRepository(repository)
    version = repo.served_versions(model)[-1]
    session = open_session(version.path, threads, spinning)
    output_names = [o.name for o in session.get_outputs()]
    config_json = orjson.dumps(repo.spec(model).config_json())
    metadata_json = orjson.dumps(
        {
            "name": model,
            "versions": [str(version.version)],
            "platform": "onnxruntime_onnx",
            "inputs": [_tensor_metadata(t) for t in session.get_inputs()],
            "outputs": [_tensor_metadata(t) for t in session.get_outputs()],
        }
    )

    counts = {"success": 0, "success_ns": 0, "infer_ns": 0}

    async def infer(request: Request) -> Response:
        started = time.perf_counter_ns()
        doc = orjson.loads(await request.body())
        feeds = {
            i["name"]: np.asarray(i["data"], dtype=to_numpy_dtype(i["datatype"])).reshape(
                i["shape"]
            )
            for i in doc["inputs"]
        }
        ran = time.perf_counter_ns()
        outputs = session.run(output_names, feeds)
        counts["infer_ns"] += time.perf_counter_ns() - ran
        body = {
            "model_name": model,
            "model_version": str(version.version),
            "outputs": [_output(n, a) for n, a in zip(output_names, outputs, strict=True)],
        }
        encoded = orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)
        counts["success"] += 1
        counts["success_ns"] += time.perf_counter_ns() - started
        return Response(encoded, media_type="application/json")

    async def stats(request: Request) -> Response:
        return Response(_statistics(model, str(version.version), counts))

    async def ready(request: Request) -> Response:
        return Response(b'{"ready": true}', media_type="application/json")

    async def server_metadata(request: Request) -> Response:
        return Response(b'{"name": "baseline", "version": "0", "extensions": []}')

    async def metadata(request: Request) -> Response:
        return Response(metadata_json, media_type="application/json")

    async def config(request: Request) -> Response:
        return Response(config_json, media_type="application/json")

    return Starlette(
        routes=[
            Route(f"/v2/models/{model}/infer", infer, methods=["POST"]),
            Route("/v2", server_metadata, methods=["GET"]),
            Route(f"/v2/models/{model}", metadata, methods=["GET"]),
            Route(f"/v2/models/{model}/config", config, methods=["GET"]),
            Route(f"/v2/models/{model}/stats", stats, methods=["GET"]),
            Route("/v2/health/ready", ready, methods=["GET"]),
        ]
    )


def _statistics(model: str, version: str, counts: dict[str, int]) -> bytes:
    """Triton's statistics extension, as far as this server knows: requests answered, the
    time spent on them and in ONNX Runtime (every request is its own execution)."""
    n = counts["success"]
    zero = {"count": 0, "ns": 0}
    stats = {
        "name": model,
        "version": version,
        "inference_count": n,
        "execution_count": n,
        "inference_stats": {
            "success": {"count": n, "ns": counts["success_ns"]},
            "fail": zero,
            "queue": {"count": n, "ns": 0},
            "compute_input": {"count": n, "ns": 0},
            "compute_infer": {"count": n, "ns": counts["infer_ns"]},
            "compute_output": {"count": n, "ns": 0},
        },
        "batch_stats": [],
    }
    return orjson.dumps({"model_stats": [stats]})


_ORT_TYPES = {"tensor(float)": "FP32", "tensor(int64)": "INT64", "tensor(int32)": "INT32"}


def _tensor_metadata(arg: Any) -> dict[str, Any]:
    """KServe v2 tensor metadata of an onnxruntime input or output (-1 for free dims)."""
    shape = [d if isinstance(d, int) else -1 for d in arg.shape]
    return {"name": arg.name, "datatype": _ORT_TYPES.get(arg.type, "BYTES"), "shape": shape}


def _output(name: str, array: Any) -> dict[str, Any]:
    arr = np.asarray(array)
    return {
        "name": name,
        "datatype": from_numpy_dtype(arr.dtype),
        "shape": list(arr.shape),
        "data": arr.reshape(-1),
    }


def main(argv: Sequence[str] | None = None) -> int:
    import uvicorn

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--repository", type=Path, default=Path("model_repository"))
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--threads", type=int, default=2, help="intra_op_num_threads")
    p.add_argument(
        "--no-spinning",
        action="store_true",
        help="session.intra_op.allow_spinning 0 (default: ONNX Runtime's, on)",
    )
    args = p.parse_args(argv)
    app = create_app(args.repository, args.model, args.threads, False if args.no_spinning else None)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
