"""The private lane: a naive KServe v2 server, one ONNX Runtime call per request.

What Plaza is compared against: Starlette + uvicorn (the same stack as Plaza's gateway),
one InferenceSession with ONNX Runtime's own defaults (as a new user writes it: spinning
threads), and no batching, no queue: each request's tensors are decoded from JSON, run on
their own in the event loop, and encoded back. It also answers the server and model
metadata, config and statistics requests (so Triton's perf_analyzer can drive it), and nothing else.

``--grpc-port`` serves the same lane over KServe v2 gRPC too (grpc.aio on the same event
loop, raw tensor contents, tritonclient's service definitions). ``--canned`` makes it the
*front's ceiling* instead: every infer request is read and answered with one answer made at
start (the model's output for zeros), nothing decoded, nothing run. perf_analyzer against
it measures what the HTTP or gRPC front and perf_analyzer itself cost on this machine, the
most that any server built on them can answer.

    python -m plaza.loadgen.baseline_server --model mlp --port 8100 [--grpc-port 8101]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from plaza.datatypes import from_numpy_dtype, to_numpy_dtype
from plaza.loadgen.raw_backend import open_session
from plaza.repository import ModelRepository

if TYPE_CHECKING:
    import uvicorn


class Lane:
    """One model's private lane: its session, its metadata, what it answered so far."""

    def __init__(
        self,
        repository: Path,
        model: str,
        threads: int = 2,
        spinning: bool | None = None,
        canned: bool = False,
    ) -> None:
        repo = ModelRepository(repository)
        version = repo.served_versions(model)[-1]
        self.model, self.version, self.canned = model, str(version.version), canned
        self.session = open_session(version.path, threads, spinning)
        self.inputs = [_tensor_metadata(t) for t in self.session.get_inputs()]
        self.outputs = [_tensor_metadata(t) for t in self.session.get_outputs()]
        self.output_names = [o["name"] for o in self.outputs]
        self.config = repo.spec(model).config_json()
        self.counts = {"success": 0, "success_ns": 0, "infer_ns": 0}
        self.zeros_answer = self.run(_zeros(self.inputs)) if canned else []

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """The session's outputs for ``feeds`` (in output order), its time counted."""
        ran = time.perf_counter_ns()
        outputs = self.session.run(self.output_names, feeds)
        self.counts["infer_ns"] += time.perf_counter_ns() - ran
        return [np.asarray(o) for o in outputs]

    def answered(self, started_ns: int) -> None:
        self.counts["success"] += 1
        self.counts["success_ns"] += time.perf_counter_ns() - started_ns

    def metadata(self) -> dict[str, Any]:
        return {
            "name": self.model,
            "versions": [self.version],
            "platform": "onnxruntime_onnx",
            "inputs": self.inputs,
            "outputs": self.outputs,
        }

    def statistics(self) -> dict[str, Any]:
        """Triton's statistics extension, as far as this lane knows: requests answered, the
        time spent on them and in ONNX Runtime (every request is its own execution)."""
        n = self.counts["success"]
        zero = {"count": 0, "ns": 0}
        stats = {
            "name": self.model,
            "version": self.version,
            "inference_count": n,
            "execution_count": n,
            "inference_stats": {
                "success": {"count": n, "ns": self.counts["success_ns"]},
                "fail": zero,
                "queue": {"count": n, "ns": 0},
                "compute_input": {"count": n, "ns": 0},
                "compute_infer": {"count": n, "ns": self.counts["infer_ns"]},
                "compute_output": {"count": n, "ns": 0},
            },
            "batch_stats": [],
        }
        return {"model_stats": [stats]}


def create_app(
    repository: Path,
    model: str,
    threads: int = 2,
    spinning: bool | None = None,
    canned: bool = False,
    lane: Lane | None = None,
) -> Starlette:
    """The app serving ``model``'s latest version at /v2/models/{model}/infer (``spinning``
    None: ONNX Runtime's default, on), on ``lane`` when given (shared with a gRPC front;
    then ``threads``, ``spinning`` and ``canned`` are the lane's)."""
    lane = lane or Lane(repository, model, threads, spinning, canned)
    config_json = orjson.dumps(lane.config)
    metadata_json = orjson.dumps(lane.metadata())
    canned_json = _json_answer(lane, lane.zeros_answer) if lane.canned else None

    async def infer(request: Request) -> Response:
        started = time.perf_counter_ns()
        body = await request.body()
        if canned_json is not None:
            encoded = canned_json
        else:
            doc = orjson.loads(body)
            feeds = {
                i["name"]: np.asarray(i["data"], dtype=to_numpy_dtype(i["datatype"])).reshape(
                    i["shape"]
                )
                for i in doc["inputs"]
            }
            encoded = _json_answer(lane, lane.run(feeds))
        lane.answered(started)
        return Response(encoded, media_type="application/json")

    async def stats(request: Request) -> Response:
        return Response(orjson.dumps(lane.statistics()))

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


def _json_answer(lane: Lane, outputs: list[np.ndarray]) -> bytes:
    body = {
        "model_name": lane.model,
        "model_version": lane.version,
        "outputs": [_output(n, a) for n, a in zip(lane.output_names, outputs, strict=True)],
    }
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


_ORT_TYPES = {"tensor(float)": "FP32", "tensor(int64)": "INT64", "tensor(int32)": "INT32"}


def _tensor_metadata(arg: Any) -> dict[str, Any]:
    """KServe v2 tensor metadata of an onnxruntime input or output (-1 for free dims)."""
    shape = [d if isinstance(d, int) else -1 for d in arg.shape]
    return {"name": arg.name, "datatype": _ORT_TYPES.get(arg.type, "BYTES"), "shape": shape}


def _zeros(inputs: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """A batch of one of zeros for each input (free dims 1)."""
    return {
        t["name"]: np.zeros(
            [1 if d < 0 else d for d in t["shape"]], dtype=to_numpy_dtype(t["datatype"])
        )
        for t in inputs
    }


def _output(name: str, array: Any) -> dict[str, Any]:
    arr = np.asarray(array)
    return {
        "name": name,
        "datatype": from_numpy_dtype(arr.dtype),
        "shape": list(arr.shape),
        "data": arr.reshape(-1),
    }


def uvicorn_config(app: Any, port: int, **extra: Any) -> uvicorn.Config:
    """uvicorn on loopback ``port`` as the naive server runs it: httptools, the running
    loop, no access log (``extra``: more ``uvicorn.Config`` options)."""
    import uvicorn

    return uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        loop="none",
        http="httptools",
        access_log=False,
        log_level="warning",
        **extra,
    )


async def serve(app: Starlette, port: int, lane: Lane, grpc_port: int | None) -> None:
    """uvicorn on ``port`` and, with ``grpc_port``, the lane's gRPC front, on one loop."""
    import uvicorn

    config = uvicorn_config(app, port)
    grpc_server = None
    if grpc_port is not None:
        from plaza.loadgen.baseline_grpc import start_grpc

        grpc_server = await start_grpc(lane, "127.0.0.1", grpc_port)
    try:
        await uvicorn.Server(config).serve()
    finally:
        if grpc_server is not None:
            await grpc_server.stop(1)


def main(argv: Sequence[str] | None = None) -> int:
    import uvloop

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--repository", type=Path, default=Path("model_repository"))
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--grpc-port", type=int, default=None, help="serve KServe v2 gRPC too")
    p.add_argument("--threads", type=int, default=2, help="intra_op_num_threads")
    p.add_argument(
        "--no-spinning",
        action="store_true",
        help="session.intra_op.allow_spinning 0 (default: ONNX Runtime's, on)",
    )
    p.add_argument(
        "--canned",
        action="store_true",
        help="answer every infer with one answer made at start: the front's ceiling",
    )
    args = p.parse_args(argv)
    lane = Lane(
        args.repository,
        args.model,
        args.threads,
        False if args.no_spinning else None,
        canned=args.canned,
    )
    app = create_app(args.repository, args.model, lane=lane)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve(app, args.port, lane, args.grpc_port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
