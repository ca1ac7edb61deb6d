"""A client's shared memory cannot hurt the gateway or misplace an answer: the reviewer's
cases, on real Kafka and Redis.

- A client that truncates and grows its object while the gateway copies from it gets
  ``shared_memory`` errors; the gateway (a real ``plaza gateway`` process, since a SIGBUS
  would stop the test's own process) keeps serving. This one is a race by nature: the
  copy is about as likely to meet a truncation as the toggling object is to be short, so
  a gateway that copied through a mapping dies within the first few requests.
- A region unregistered (and registered again on another object) while a request that
  names it for its output is in flight: the answer still lands in the region the request
  named, and the object's descriptor is closed once that request is done.
- Inputs in shared memory are bounded as a body is: 413 ``payload_too_large`` before
  they are copied, counting every shared memory input of the request.
- A key that is not a plain ``shm_open`` name is 400 ``shared_memory``.
"""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc.aio as grpc_aio
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from plaza.loadgen.stack import copy_model
from plaza.settings import GatewaySettings, KafkaSettings, PlazaSettings
from plaza.stack import Deployment, GatewayProcess, ProcessGroup, free_port, new_prefix
from tests.integration.test_shared_memory import region
from tests.support import REPOSITORY, gateway_fronts, running_worker, wait_for

MiB = 1024 * 1024
LIMIT = min(
    int(GatewaySettings.model_fields["max_body_bytes"].default),
    int(KafkaSettings.model_fields["max_request_bytes"].default),
)
"""The most input bytes a body may carry with the default settings (the tests' own)."""
TOGGLE = """
import os, sys
path, size = sys.argv[1], int(sys.argv[2])
print("toggling", flush=True)
while True:
    os.truncate(path, 0)
    os.truncate(path, size)
"""
"""A client that shrinks its object to nothing and grows it back, as fast as it can."""


def allowing_shm(settings: PlazaSettings, **gateway: Any) -> PlazaSettings:
    update = {"allow_client_shm": True, **gateway}
    return settings.model_copy(update={"gateway": settings.gateway.model_copy(update=update)})


def shm_input(name: str, region_name: str, byte_size: int) -> dict[str, Any]:
    params = {"shared_memory_region": region_name, "shared_memory_byte_size": byte_size}
    return {"name": name, "datatype": "FP32", "shape": [1, byte_size // 4], "parameters": params}


@asynccontextmanager
async def gateway_process(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> AsyncIterator[GatewayProcess]:
    """A real ``plaza gateway`` serving identity (no worker), client shared memory allowed."""
    copy_model(REPOSITORY, tmp_path / "repo", "identity")
    dep = Deployment(kafka_bootstrap, redis_url, tmp_path / "repo", new_prefix("tshm"))
    procs = ProcessGroup(tmp_path / "logs")
    env = {"PLAZA_GATEWAY__ALLOW_CLIENT_SHM": "true", "PLAZA_GATEWAY__MODELS": "identity"}
    gateway = GatewayProcess(dep, free_port(), procs.log_dir, env=env)
    try:
        procs.start(gateway)
        await gateway.wait_live(limit_s=90)
        yield gateway
    finally:
        procs.stop_all()


@contextmanager
def toggling(path: str, size: int) -> Iterator[None]:
    tog = subprocess.Popen(
        [sys.executable, "-c", TOGGLE, path, str(size)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert tog.stdout is not None and tog.stdout.readline() == "toggling\n"
        yield
    finally:
        tog.kill()
        tog.wait()


async def test_an_object_truncated_during_the_copy_is_an_error_not_a_dead_gateway(
    kafka_bootstrap: str, redis_url: str, tmp_path: Path
) -> None:
    size = LIMIT - MiB
    # The second input names no registered region: each request that gets its first input
    # copied is refused there at once (no worker needs to answer it).
    body = {"inputs": [shm_input("INPUT0", "in", size), shm_input("INPUT1", "never", 4)]}
    answers: list[tuple[int, str]] = []
    with region(size) as (key, _):
        async with (
            gateway_process(kafka_bootstrap, redis_url, tmp_path) as gw,
            httpx.AsyncClient(base_url=gw.url, timeout=60) as client,
        ):
            reg = {"key": key, "byte_size": size}
            registered = await client.post("/v2/systemsharedmemory/region/in/register", json=reg)
            assert registered.status_code == 200, registered.text
            with toggling(f"/dev/shm/{key.strip('/')}", size):
                for _ in range(40):
                    try:
                        answer = await client.post("/v2/models/identity/infer", json=body)
                    except httpx.TransportError as exc:
                        pytest.fail(f"the gateway stopped ({exc!r}): {gw.exit_code=}")
                    answers.append((answer.status_code, answer.json()["code"]))
                    assert "region 'in'" in answer.json()["error"] or "'never'" in answer.text
            assert gw.alive
            assert (await client.get("/v2/health/live")).status_code == 200
    # a copy cut short (400), or the copy done and the next input's region not found (404)
    assert set(answers) <= {(400, "shared_memory"), (404, "shared_memory_not_found")}


async def test_an_answer_goes_to_the_region_its_request_named_though_unregistered(
    settings: PlazaSettings,
) -> None:
    settings = allowing_shm(settings, sync_timeout_s=60.0)
    out = {"shared_memory_region": "out", "shared_memory_byte_size": 16}
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}],
        "outputs": [{"name": "OUTPUT0", "parameters": out}],
    }
    expected = np.array([1, 2, 3, 4], np.float32)
    with region(16) as (key_a, handle_a), region(16) as (key_b, handle_b):
        client_fds = len(_open_fds(key_a))  # tritonclient's own handle
        async with gateway_fronts(settings) as gw, httpx.AsyncClient(timeout=90) as client:
            producer = gw.service._producer  # its byte budget says when the request is in flight
            assert producer is not None
            base = f"{gw.http_url}/v2/systemsharedmemory/region/out"

            async def register(key: str) -> None:
                answer = await client.post(f"{base}/register", json={"key": key, "byte_size": 16})
                assert answer.status_code == 200, answer.text

            async def unregister() -> None:
                assert (await client.post(f"{base}/unregister")).status_code == 200

            async def in_flight() -> asyncio.Task[httpx.Response]:
                infer = asyncio.create_task(
                    client.post(f"{gw.http_url}/v2/models/identity/infer", json=body)
                )
                await wait_for(lambda: producer.inflight.used > 0, 30, "the request in flight")
                return infer

            await register(key_a)
            infer = await in_flight()  # no worker yet: it waits, its output bound to A
            await unregister()
            await register(key_b)
            async with running_worker(settings, "identity"):
                moved = await infer
            from_a = shm.get_contents_as_numpy(handle_a, np.float32, [4]).copy()
            from_b = shm.get_contents_as_numpy(handle_b, np.float32, [4]).copy()

            shm.set_shared_memory_region(handle_a, [np.zeros(4, np.float32)])
            await unregister()
            await register(key_a)
            infer = await in_flight()
            await unregister()  # gone for good
            async with running_worker(settings, "identity"):
                unregistered = await infer
            from_a_again = shm.get_contents_as_numpy(handle_a, np.float32, [4]).copy()
            # the gateway's descriptor of A is closed now that no request holds it
            await wait_for(lambda: len(_open_fds(key_a)) == client_fds, 30, "A's fd closed")
    assert moved.status_code == 200, moved.text
    np.testing.assert_array_equal(from_a, expected)
    np.testing.assert_array_equal(from_b, np.zeros(4, np.float32))  # registered after it
    assert unregistered.status_code == 200, unregistered.text
    np.testing.assert_array_equal(from_a_again, expected)


def _open_fds(key: str) -> list[str]:
    """This process's descriptors open on the memory object ``key`` (after a collection,
    so a descriptor held only by garbage does not count)."""
    gc.collect()
    target = f"/dev/shm/{key.strip('/')}"
    links = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            links.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # closed meanwhile
            continue
    return [link for link in links if link == target]


async def test_inputs_in_shared_memory_are_bounded_as_a_body_is(settings: PlazaSettings) -> None:
    """No worker: a request that got past its limit would be published and wait; the
    refusal comes at once, before the bytes are copied (a body could not carry them). The
    gateway's configured body limit (smaller than the default) is the one applied, to one
    input and to the inputs of a request together, over HTTP and gRPC."""
    limit = 256 * 1024
    assert limit < LIMIT
    settings = allowing_shm(settings, sync_timeout_s=5.0, max_body_bytes=limit)
    half = limit // 2 + 4096
    with region(2 * half) as (key, _):
        async with gateway_fronts(settings) as gw, httpx.AsyncClient(timeout=30) as client:
            reg = {"key": key, "byte_size": 2 * half}
            url = f"{gw.http_url}/v2/systemsharedmemory/region/in/register"
            assert (await client.post(url, json=reg)).status_code == 200
            infer = f"{gw.http_url}/v2/models/identity/infer"
            one = {"inputs": [shm_input("INPUT0", "in", 2 * half)]}
            two = {"inputs": [shm_input("INPUT0", "in", half), shm_input("INPUT1", "in", half)]}
            answers = [await client.post(infer, json=doc) for doc in (one, two)]
            grpc = grpc_aio.InferenceServerClient(gw.grpc_address)
            try:
                inputs = [
                    grpc_aio.InferInput(n, [1, half // 4], "FP32") for n in ("INPUT0", "INPUT1")
                ]
                for each in inputs:
                    each.set_shared_memory("in", half)
                with pytest.raises(InferenceServerException) as refused:
                    await grpc.infer("identity", inputs)
            finally:
                await grpc.close()
    for answer in answers:
        assert (answer.status_code, answer.json()["code"]) == (413, "payload_too_large")
        assert "inputs in shared memory add up to" in answer.json()["error"]
    assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "inputs in shared memory add up to" in str(refused.value.message())


async def test_a_key_that_is_no_shm_open_name_is_a_shared_memory_error(
    settings: PlazaSettings,
) -> None:
    async with gateway_fronts(allowing_shm(settings)) as gw, httpx.AsyncClient() as client:
        url = f"{gw.http_url}/v2/systemsharedmemory/region/bad/register"
        answer = await client.post(url, json={"key": "../etc/passwd", "byte_size": 8})
    assert (answer.status_code, answer.json()["code"]) == (400, "shared_memory")
    assert "not a shm_open name" in answer.json()["error"]
