"""``gateway.workers = 2``: two gateway processes share the HTTP and gRPC ports.

A real worker (the simulated device) and a gateway process started with
``PLAZA_GATEWAY__WORKERS=2``; requests on fresh connections are all answered, both gateway
processes answered some (each has its own reply stream in Redis, named by its gateway id),
the gRPC port answers, and stopping the parent stops both processes.
"""

from __future__ import annotations

import asyncio
import os
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio
import tritonclient.grpc.aio as grpcclient

from plaza.loadgen.stack import copy_model
from plaza.stack import (
    Deployment,
    GatewayProcess,
    ProcessGroup,
    WorkerProcess,
    free_port,
    new_prefix,
    wait_for,
    wait_workers,
)
from tests.support import REPOSITORY

MODEL = "simulated"
REQUESTS = 48
_PROCESS_LINE = re.compile(r"gateway process (\d+): HTTP")


@pytest.fixture
async def two_gateways(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> AsyncIterator[dict[str, Any]]:
    copy_model(REPOSITORY, tmp_path / "repo", MODEL)
    dep = Deployment(kafka_bootstrap, redis_url, tmp_path / "repo", new_prefix("tgw2"))
    procs = ProcessGroup(tmp_path / "logs")
    grpc_port = free_port()
    gateway = GatewayProcess(
        dep,
        free_port(),
        procs.log_dir,
        grpc_port=grpc_port,
        env={"PLAZA_GATEWAY__WORKERS": "2", "PLAZA_GATEWAY__MODELS": MODEL},
    )
    try:
        procs.start(WorkerProcess(dep, MODEL, procs.log_dir))
        procs.start(gateway)
        await wait_workers(dep, MODEL, 1, procs, limit_s=90)
        await gateway.wait_ready(limit_s=90)
        yield {"dep": dep, "gateway": gateway, "grpc": f"127.0.0.1:{grpc_port}", "procs": procs}
    finally:
        procs.stop_all()


def _body() -> dict[str, Any]:
    data = [float(i) for i in range(16)]
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": data}]}


async def _infer_on_new_connection(url: str) -> int:
    # A client per request: a new TCP connection, which the kernel gives to either process.
    async with httpx.AsyncClient(timeout=30) as client:
        response = await client.post(f"{url}/v2/models/{MODEL}/infer", json=_body())
        return response.status_code


async def _reply_streams(dep: Deployment) -> dict[str, int]:
    client = redis.asyncio.Redis.from_url(dep.redis_url)
    try:
        pattern = dep.names.reply_stream("") + "*"
        keys = [k.decode() async for k in client.scan_iter(match=pattern)]
        return {k: int(await client.xlen(k)) for k in keys}
    finally:
        await client.aclose()


def _child_pids(gateway: GatewayProcess) -> set[int]:
    return {int(m.group(1)) for m in _PROCESS_LINE.finditer(gateway.log_text())}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_two_gateway_processes_share_the_ports(two_gateways: dict[str, Any]) -> None:
    dep: Deployment = two_gateways["dep"]
    gateway: GatewayProcess = two_gateways["gateway"]
    codes = await asyncio.gather(*(_infer_on_new_connection(gateway.url) for _ in range(REQUESTS)))
    assert codes == [200] * REQUESTS

    streams = await _reply_streams(dep)
    served = {k: n for k, n in streams.items() if n > 0}
    assert len(served) == 2, streams  # each process has its own reply stream, both used

    async with grpcclient.InferenceServerClient(two_gateways["grpc"]) as grpc_client:
        assert await grpc_client.is_model_ready(MODEL)

    pids = _child_pids(gateway)
    assert len(pids) == 2, gateway.tail()
    two_gateways["procs"].stop([gateway])
    assert gateway.exit_code == 0, gateway.tail()

    async def both_gone() -> bool:
        return not any(_alive(p) for p in pids)

    await wait_for(both_gone, 30, "both gateway processes to exit")


def test_a_taken_port_stops_every_gateway_process_with_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLAZA_")}
        env.update(
            PLAZA_GATEWAY__WORKERS="2",
            PLAZA_GATEWAY__HTTP_PORT=str(port),
            PLAZA_GATEWAY__GRPC_PORT="0",
            PLAZA_GATEWAY__METRICS_PORT="-1",
            PLAZA_REPOSITORY=str(REPOSITORY),
        )
        proc = subprocess.run(
            [sys.executable, "-m", "plaza.cli.main", "gateway"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 1
    assert f"plaza gateway: error: the HTTP front cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr
