"""Triton's model control end to end: the repository API (HTTP and gRPC), modes explicit
and poll, the model table and the supervisor that runs the workers it asks for.

Each test serves one real gateway (both fronts) in this process and a real
``ModelSupervisor`` whose workers are ``plaza worker`` subprocesses, on the session's
Kafka and Redis, under a prefix of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from plaza.gateway.main import Serving, serving
from plaza.model_control import ModelTable
from plaza.settings import GatewaySettings, PlazaSettings
from plaza.stack import Deployment, ProcessGroup, free_port
from plaza.stack.supervisor import ModelSupervisor
from tests.support import wait_for

pytestmark = pytest.mark.timeout(240)


@contextlib.asynccontextmanager
async def plaza_with_control(
    dep: Deployment, tmp_path: Path, **gateway: Any
) -> AsyncIterator[tuple[Serving, httpx.AsyncClient, ModelSupervisor]]:
    """A gateway in model control ``gateway`` settings, and a supervisor reconciling."""
    settings: PlazaSettings = dep.settings().model_copy(
        update={"gateway": GatewaySettings(metrics_port=-1, **gateway)}
    )
    group = ProcessGroup(tmp_path / "logs")
    supervisor = ModelSupervisor(dep, dep.repository, group, drain_limit_s=60)
    await supervisor.start()

    async def reconcile_forever() -> None:
        while True:
            await supervisor.reconcile()
            await asyncio.sleep(0.2)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    task = asyncio.create_task(reconcile_forever())
    try:
        async with (
            serving(settings, http_socket=sock, grpc_port=0) as gw,
            httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=150) as http,
        ):
            yield gw, http, supervisor
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await asyncio.to_thread(group.stop_all, 30)
        await supervisor.close()
        sock.close()
        # the supervisor's workers, not the group's members: none exited unasked (the ones
        # a test kills on purpose, SIGKILL, aside)
        supervisor.check(killed_ok=True)


@pytest.fixture
def deployment(
    kafka_bootstrap: str, redis_url: str, unique_id: str, make_repository: Callable[..., Path]
) -> Deployment:
    return Deployment(
        kafka_bootstrap, redis_url, make_repository("identity", "add_sub"), prefix=unique_id,
        partitions=2,
    )  # fmt: skip


def identity_body(x: np.ndarray[Any, Any]) -> dict[str, Any]:
    return {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": list(x.shape),
                "data": x.ravel().tolist(),
            }
        ]
    }


def states(index: list[dict[str, Any]]) -> dict[str, str]:
    return {row["name"]: row.get("state", "") for row in index}


async def test_explicit_mode_loads_serves_and_unloads_draining_the_queue(
    deployment: Deployment, tmp_path: Path
) -> None:
    x = np.arange(6, dtype=np.float32).reshape(1, 6)
    async with plaza_with_control(deployment, tmp_path, model_control_mode="explicit") as (
        gw,
        http,
        supervisor,
    ):
        before = (await http.post("/v2/repository/index")).json()
        assert states(before) == {"add_sub": "", "identity": ""}
        refused = await http.post("/v2/models/identity/infer", json=identity_body(x))
        assert refused.status_code == 404

        loaded = await http.post("/v2/repository/models/identity/load")
        assert loaded.status_code == 200, loaded.text
        index = (await http.post("/v2/repository/index", json={"ready": True})).json()
        assert index == [{"name": "identity", "version": "1", "state": "READY"}]
        answer = await http.post("/v2/models/identity/infer", json=identity_body(x))
        assert answer.json()["outputs"][0]["data"] == x.ravel().tolist()

        jobs = [
            (await http.post("/v2/models/identity/jobs", json=identity_body(x * i))).json()[
                "job_id"
            ]
            for i in range(30)
        ]
        unloaded = await http.post("/v2/repository/models/identity/unload")
        assert unloaded.status_code == 200, unloaded.text
        after = await http.post("/v2/models/identity/infer", json=identity_body(x))
        assert after.status_code == 404

        async def all_done() -> bool:
            polled = [(await http.get(f"/v2/jobs/{j}")).json()["status"] for j in jobs]
            return all(status == "done" for status in polled)

        await wait_for(all_done, 90, "the jobs queued before the unload to be answered")
        await wait_for(lambda: "identity" not in supervisor.running, 90, "the workers to stop")
        index = (await http.post("/v2/repository/index")).json()
        assert {"name": "identity", "state": "UNAVAILABLE", "reason": "unloaded"} in index
        table = await ModelTable(gw.service._require(gw.service._redis), deployment.names).read()
        assert not table["identity"].loaded


async def test_grpc_load_with_a_config_override_and_errors(
    deployment: Deployment, tmp_path: Path
) -> None:
    async with plaza_with_control(deployment, tmp_path, model_control_mode="explicit") as (
        gw,
        http,
        _,
    ):
        config = (await http.get("/v2/models/add_sub/config")).status_code
        assert config == 404  # not loaded yet
        client = aioclient.InferenceServerClient(gw.grpc_address)
        try:
            override = json.dumps(
                {
                    "name": "add_sub",
                    "platform": "onnxruntime_onnx",
                    "max_batch_size": 8,
                    "input": [
                        {"name": f"INPUT{i}", "data_type": "TYPE_INT32", "dims": [16]}
                        for i in (0, 1)
                    ],
                    "output": [
                        {"name": f"OUTPUT{i}", "data_type": "TYPE_INT32", "dims": [16]}
                        for i in (0, 1)
                    ],
                }
            )
            await client.load_model("add_sub", config=override)
            served = await client.get_model_config("add_sub", as_json=True)
            with pytest.raises(InferenceServerException) as unknown:
                await client.load_model("no_such_model")
            with pytest.raises(InferenceServerException) as broken:
                await client.load_model("identity", config='{"max_batch_size": "lots"}')
            inputs = [aioclient.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in (0, 1)]
            for item in inputs:
                item.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
            result = await client.infer("add_sub", inputs)
            await client.unload_model("add_sub")
        finally:
            await client.close()
    assert int(served["config"]["max_batch_size"]) == 8
    assert unknown.value.status() == "StatusCode.NOT_FOUND"
    assert broken.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "identity" in broken.value.message()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 16), 2))


async def test_poll_mode_follows_the_repository(deployment: Deployment, tmp_path: Path) -> None:
    parked = tmp_path / "parked-add_sub"
    shutil.move(deployment.repository / "add_sub", parked)
    body = {
        "inputs": [
            {"name": f"INPUT{i}", "datatype": "INT32", "shape": [1, 16], "data": [i + 1] * 16}
            for i in (0, 1)
        ]
    }
    async with plaza_with_control(
        deployment, tmp_path, model_control_mode="poll", repository_poll_s=0.3
    ) as (gw, http, supervisor):
        assert set(gw.service.models) == {"identity"}
        shutil.copytree(parked, deployment.repository / "add_sub")

        async def add_sub_answers() -> bool:
            response = await http.post("/v2/models/add_sub/infer", json=body)
            return response.status_code == 200 and response.json()["outputs"][0]["data"] == [3] * 16

        await wait_for(add_sub_answers, 90, "the new model to be loaded and served")
        shutil.rmtree(deployment.repository / "add_sub")
        await wait_for(lambda: "add_sub" not in gw.service.models, 30, "the unload")
        await wait_for(lambda: "add_sub" not in supervisor.running, 90, "its workers to stop")
        gone = await http.post("/v2/models/add_sub/infer", json=body)
        assert gone.status_code == 404


def test_plaza_up_in_explicit_mode(tmp_path: Path, make_repository: Callable[..., Path]) -> None:
    repo = make_repository("identity", "add_sub")
    http_port = free_port()
    argv = [
        sys.executable, "-m", "plaza.cli.main", "up", "--repository", str(repo),
        "--data-dir", str(tmp_path / "up"), "--kafka-port", str(free_port(count=2)),
        "--redis-port", str(free_port()), "--http-port", str(http_port),
        "--grpc-port", str(free_port()), "--metrics-port", str(free_port()),
        "--model-control-mode", "explicit", "--load-model", "add_sub",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "Ctrl-C stops everything" in line or "error" in line:
                break
        base = f"http://127.0.0.1:{http_port}"
        with httpx.Client(base_url=base, trust_env=False, timeout=150) as http:
            index = states(http.post("/v2/repository/index").json())
            assert index == {"add_sub": "READY", "identity": ""}
            assert http.post("/v2/repository/models/identity/load").status_code == 200
            x = np.ones((1, 4), dtype=np.float32)
            answer = http.post("/v2/models/identity/infer", json=identity_body(x)).json()
            assert answer["outputs"][0]["data"] == [1.0] * 4
            assert http.post("/v2/repository/models/identity/unload").status_code == 200
            assert http.post("/v2/models/identity/infer", json=identity_body(x)).status_code == 404
    finally:
        proc.send_signal(2)
        rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, rest
