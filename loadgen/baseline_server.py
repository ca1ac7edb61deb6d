"""The private lane: a naive KServe v2 JSON server, one ONNX Runtime call per request.

What Plaza is compared against: Starlette + uvicorn (the same stack as Plaza's gateway),
one InferenceSession configured like a worker's, and no batching, no queue: each request's
tensors are decoded from JSON, run on their own in the event loop, and encoded back.

    python -m plaza.loadgen.baseline_server --model mlp --port 8100
"""

from __future__ import annotations

import argparse
import sys
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


def create_app(repository: Path, model: str, threads: int = 2) -> Starlette:
    """The app serving ``model``'s latest version at /v2/models/{model}/infer."""
    version = ModelRepository(repository).served_versions(model)[-1]
    session = open_session(version.path, threads)
    output_names = [o.name for o in session.get_outputs()]

    async def infer(request: Request) -> Response:
        doc = orjson.loads(await request.body())
        feeds = {
            i["name"]: np.asarray(i["data"], dtype=to_numpy_dtype(i["datatype"])).reshape(
                i["shape"]
            )
            for i in doc["inputs"]
        }
        outputs = session.run(output_names, feeds)
        body = {
            "model_name": model,
            "model_version": str(version.version),
            "outputs": [_output(n, a) for n, a in zip(output_names, outputs, strict=True)],
        }
        return Response(
            orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json"
        )

    async def ready(request: Request) -> Response:
        return Response(b'{"ready": true}', media_type="application/json")

    return Starlette(
        routes=[
            Route(f"/v2/models/{model}/infer", infer, methods=["POST"]),
            Route("/v2/health/ready", ready, methods=["GET"]),
        ]
    )


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
    args = p.parse_args(argv)
    app = create_app(args.repository, args.model, args.threads)
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
