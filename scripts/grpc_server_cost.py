"""A canned gRPC server's CPU per call under perf_analyzer: the gateway's own server
(``own``, gateway/grpc_server.py) against grpc.aio, and grpcio's sync server alone and
handing each call to an asyncio loop (as a gateway on the sync server would have to).

    python scripts/grpc_server_cost.py [--modes own,aio,aio,own] [-c 16,64]
    python scripts/grpc_server_cost.py --modes aio,sync,sync-loop,aio
    python scripts/grpc_server_cost.py --modes aio-sleep-5,aio-sleep-20 -c 16,64

Each mode runs the baseline's canned mlp answer (``loadgen/baseline_grpc.py``) in a server
process of its own on port 18190; ``aio-sleep-MS`` holds each call MS milliseconds on the
loop first (calls pending as they are behind Plaza's stack). perf_analyzer (``make
bench-tools``) drives it, one run per concurrency; the server's CPU is read from /proc.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from plaza.event_loop import loop_factory, run
from plaza.gateway.grpc_front import SERVICE
from plaza.gateway.grpc_server import GrpcServer, methods_of
from plaza.loadgen import perf_analyzer as pa
from plaza.loadgen.baseline_grpc import LaneServicer
from plaza.loadgen.baseline_server import Lane
from plaza.loadgen.inputs import input_pool
from plaza.model_control import model_spec
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings

PORT = 18190
MODEL = "mlp"


def _serve_aio(lane: Lane, sleep_s: float) -> None:
    servicer = LaneServicer(lane)
    if sleep_s:
        canned = servicer.ModelInfer

        async def held(request: Any, context: Any) -> Any:
            await asyncio.sleep(sleep_s)
            return await canned(request, context)

        servicer.ModelInfer = held  # type: ignore[method-assign]

    async def main() -> None:
        server = grpc.aio.server()
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
        server.add_insecure_port(f"127.0.0.1:{PORT}")
        await server.start()
        await server.wait_for_termination()

    run(main())


class _SyncServicer(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """The canned lane on grpcio's thread-pool server; with ``loop``, each ModelInfer is
    answered by a coroutine on that loop's thread while the pool thread waits."""

    def __init__(self, lane: Lane, loop: asyncio.AbstractEventLoop | None) -> None:
        self.lane, self.loop = lane, loop
        self.aio = LaneServicer(lane)

    def ServerLive(self, request: Any, context: Any) -> Any:
        return pb.ServerLiveResponse(live=True)

    def ServerReady(self, request: Any, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=True)

    def ModelReady(self, request: Any, context: Any) -> Any:
        return pb.ModelReadyResponse(ready=request.name == self.lane.model)

    def ServerMetadata(self, request: Any, context: Any) -> Any:
        return pb.ServerMetadataResponse(name="baseline", version="0")

    def ModelMetadata(self, request: Any, context: Any) -> Any:
        return json_format.ParseDict(self.lane.metadata(), pb.ModelMetadataResponse())

    def ModelConfig(self, request: Any, context: Any) -> Any:
        return self.aio._config

    def ModelStatistics(self, request: Any, context: Any) -> Any:
        return json_format.ParseDict(self.lane.statistics(), pb.ModelStatisticsResponse())

    def ModelInfer(self, request: Any, context: Any) -> Any:
        started = time.perf_counter_ns()
        if self.loop is None:
            response = self.aio._canned
        else:

            async def answer() -> Any:
                return self.aio._canned

            response = asyncio.run_coroutine_threadsafe(answer(), self.loop).result()
        self.lane.answered(started)
        return response


def _serve_sync(lane: Lane, hand_off: bool) -> None:
    loop = None
    if hand_off:
        factory = loop_factory()
        loop = factory() if factory else asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=80))
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(_SyncServicer(lane, loop), server)
    server.add_insecure_port(f"127.0.0.1:{PORT}")
    server.start()
    server.wait_for_termination()


def _serve_own(lane: Lane) -> None:
    async def main() -> None:
        servicer = LaneServicer(lane)
        table = methods_of(SERVICE, servicer, pb_grpc.GRPCInferenceServiceServicer)
        server = GrpcServer(table, max_message_bytes=64 << 20)
        await server.start("127.0.0.1", PORT)
        await asyncio.Event().wait()

    run(main())


def serve(mode: str) -> None:
    lane = Lane(PlazaSettings().repository, MODEL, 1, False, True)
    if mode == "own":
        _serve_own(lane)
    elif mode.startswith("aio"):
        sleep_ms = float(mode.split("-")[-1]) if mode.startswith("aio-sleep-") else 0.0
        _serve_aio(lane, sleep_ms / 1000)
    else:
        _serve_sync(lane, hand_off=mode == "sync-loop")


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def measure(modes: list[str], concurrencies: list[int]) -> None:
    spec = model_spec(ModelRepository(PlazaSettings().repository), MODEL)
    data = pa.write_input_data(input_pool(spec), Path("var/profile/grpc_server_cost.json"))
    for mode in modes:
        server = subprocess.Popen([sys.executable, __file__, "--serve", mode])
        time.sleep(4)
        try:
            for c in concurrencies:
                ticks, began = _cpu_ticks(server.pid), time.monotonic()
                result = pa.run(MODEL, f"127.0.0.1:{PORT}", "grpc", c, data)
                wall = time.monotonic() - began
                calls = result.throughput * wall  # perf_analyzer's rate over the whole run
                server_us = (_cpu_ticks(server.pid) - ticks) * 1e4 / calls
                print(
                    f"{mode:14s} c={c:<3d} infer/s {result.throughput:7.0f}  p50 "
                    f"{result.p50_ms:6.2f} ms  server {server_us:4.0f} us/call  "
                    f"perf_analyzer {result.cpu_s * 1e6 / calls:4.0f} us/call",
                    flush=True,
                )
        finally:
            server.terminate()
            server.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--modes", default="own,aio,aio,own")
    parser.add_argument("-c", default="16,64", help="concurrencies, comma-separated")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return
    Path("var/profile").mkdir(parents=True, exist_ok=True)
    measure(args.modes.split(","), [int(c) for c in args.c.split(",")])


if __name__ == "__main__":
    main()
