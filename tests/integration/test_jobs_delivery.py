"""Async jobs and result delivery at their edges: a job marker Redis refuses, a result too
large for Redis, the client's id and binary choices kept with a job, an ensemble step's id.

Real Kafka and Redis throughout; a private redis-server where a test changes its config
(``maxmemory``, ``proto-max-bulk-len``) so that the shared one is never touched.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import redis.asyncio

from plaza.codec import decode_result, decode_results
from plaza.contract import InferResult
from plaza.resp_channel import CommandError
from plaza.results import ResultStore
from plaza.settings import PlazaSettings
from plaza.stack import RedisServer
from plaza.tensors import Tensor
from plaza.workers.writer import ResultWriter, StateWrite
from tests.support import gateway_fronts, make_settings, running_worker, wait_for

HEADER = "Inference-Header-Content-Length"
IDENTITY_BODY = {
    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]
}


@asynccontextmanager
async def http(settings: PlazaSettings) -> AsyncIterator[httpx.AsyncClient]:
    async with (
        gateway_fronts(settings) as running,
        httpx.AsyncClient(base_url=running.http_url, trust_env=False, timeout=60) as client,
    ):
        yield client


async def poll_until_finished(client: httpx.AsyncClient, job_id: str) -> httpx.Response:
    """The job's poll once it is no longer pending (nor unknown)."""
    last: httpx.Response | None = None

    async def finished() -> bool:
        nonlocal last
        last = await client.get(f"/v2/jobs/{job_id}")
        if last.status_code == 404:
            return False
        assert last.status_code == 200, last.text
        return last.headers["content-type"] != "application/json" or (
            last.json()["status"] != "pending"
        )

    await wait_for(finished, 60, f"job {job_id} to finish")
    assert last is not None
    return last


def split_binary(response: httpx.Response) -> tuple[dict[str, Any], bytes]:
    length = int(response.headers[HEADER])
    return orjson.loads(response.content[:length]), response.content[length:]


async def stored_result(client: redis.asyncio.Redis, key: str) -> InferResult:
    raw = await client.get(key)
    assert isinstance(raw, bytes), key
    return decode_result(raw)


def result(rid: str, values: np.ndarray[Any, Any]) -> InferResult:
    return InferResult(rid, "identity", "1", outputs=(Tensor.from_numpy("OUTPUT0", values),))


async def test_a_job_is_never_a_503_once_kafka_took_it_though_its_marker_is_refused(
    kafka_bootstrap: str,
    unique_id: str,
    make_repository: Callable[..., Any],
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory()
    settings = make_settings(
        kafka_bootstrap,
        server.url,
        unique_id,
        repository=make_repository("identity"),
        gateway={"sync_timeout_s": 1.0},
    )
    admin = redis.asyncio.Redis.from_url(server.url)
    try:
        async with running_worker(settings, "identity"), http(settings) as client:
            warm = await client.post("/v2/models/identity/infer", json=IDENTITY_BODY)
            assert warm.status_code == 200, warm.text  # the reply stream is made
            await admin.config_set("maxmemory-policy", "noeviction")
            await admin.config_set("maxmemory", 1)  # every write is refused (OOM) from now

            job = await client.post("/v2/models/identity/jobs", json=IDENTITY_BODY)
            assert job.status_code == 202, job.text  # Kafka has it: a 503 would run it twice
            job_id = job.json()["job_id"]
            late = await client.post("/v2/models/identity/infer", json=IDENTITY_BODY)
            assert late.status_code == 504, late.text  # its answer cannot be stored either
            assert late.json()["code"] == "timeout" and late.json()["job_id"]
            # no marker and no result yet: unknown (the docs say so)
            assert (await client.get(f"/v2/jobs/{job_id}")).status_code == 404

            await admin.config_set("maxmemory", 0)
            for jid in (job_id, late.json()["job_id"]):
                done = (await poll_until_finished(client, jid)).json()
                assert done["status"] == "done", done  # the result key alone answers
                assert done["outputs"][0]["data"] == [1.0, 2.0, 3.0, 4.0]
    finally:
        await admin.aclose()


async def test_a_result_over_max_result_bytes_is_an_error_and_the_others_are_answered(
    kafka_bootstrap: str,
    redis_url: str,
    unique_id: str,
    make_repository: Callable[..., Any],
    redis_client: redis.asyncio.Redis,
) -> None:
    settings = make_settings(
        kafka_bootstrap,
        redis_url,
        unique_id,
        repository=make_repository("identity"),
        redis={"max_result_bytes": 64 * 1024},
    )
    big = {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 32768], "data": [0.5] * 32768}
        ]
    }
    async with running_worker(settings, "identity"), http(settings) as client:
        big_id = (await client.post("/v2/models/identity/jobs", json=big)).json()["job_id"]
        small_id = (await client.post("/v2/models/identity/jobs", json=IDENTITY_BODY)).json()[
            "job_id"
        ]
        refused = (await poll_until_finished(client, big_id)).json()
        assert refused["status"] == "error" and refused["code"] == "payload_too_large"
        assert "over redis.max_result_bytes (65536)" in refused["error"]
        done = (await poll_until_finished(client, small_id)).json()
        assert done["status"] == "done" and done["outputs"][0]["data"] == [1.0, 2.0, 3.0, 4.0]


async def test_a_result_over_redis_own_bulk_limit_is_an_error_its_batch_mates_kept(
    unique_id: str,
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    server = redis_server_factory()
    settings = make_settings("127.0.0.1:1", server.url, unique_id)  # max_result_bytes 128 MiB
    names = settings.names
    client = redis.asyncio.Redis.from_url(server.url)
    writer = ResultWriter(client, settings.redis, names)
    try:
        stream = names.results_stream("jobs")
        await writer.write([(result("before", np.zeros(1, np.float32)), stream)])
        # Redis' limit lowered after the writer's first write: it refuses (a protocol error,
        # its connection closed) a value over 1 MiB, however often it is sent
        await client.config_set("proto-max-bulk-len", 1024 * 1024)
        batch = [
            (result("a", np.arange(4, dtype=np.float32)), stream),
            (result("big", np.ones(300_000, dtype=np.float32)), stream),  # 1.2 MB
            (result("c", np.arange(3, dtype=np.float32)), stream),
        ]
        state = StateWrite(2, names.sequence_state_key("identity", 1, 7), b"after c", 60_000)
        assert await writer.write_until_done(batch, states=[state]) == 3

        stored = {rid: await stored_result(client, names.result_key(rid)) for rid in ("a", "c")}
        big = await stored_result(client, names.result_key("big"))
        assert big.error is not None and big.error.code == "payload_too_large"
        assert "over Redis' proto-max-bulk-len (1048576)" in big.error.message
        assert stored["a"].outputs[0].to_numpy().tolist() == [0.0, 1.0, 2.0, 3.0]
        assert stored["c"].outputs[0].to_numpy().tolist() == [0.0, 1.0, 2.0]
        assert await client.get(state.key) == b"after c"  # its state went with its answer
    finally:
        await writer.close()
        await client.aclose()


class RefusingScript:
    """The writer's real script call, save that Redis' refusal of a value over ``over``
    bytes is injected as the error reply that the same write gets every time (a real Redis
    may close the connection before its reply is read: the test above)."""

    def __init__(self, real: Any, over: int) -> None:
        self.real, self.over = real, over

    async def __call__(self, keys: list[str], args: list[Any]) -> Any:
        if any(isinstance(arg, bytes) and len(arg) > self.over for arg in args):
            raise CommandError("ERR Protocol error: invalid bulk length")
        return await self.real(keys, args)

    async def close(self) -> None:
        await self.real.close()


async def test_a_write_redis_refuses_for_good_isolates_its_result(
    redis_client: redis.asyncio.Redis,
    settings: PlazaSettings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    names = settings.names
    writer = ResultWriter(redis_client, settings.redis, names)
    monkeypatch.setattr(writer, "_script", RefusingScript(writer._script, 50_000))
    stream = names.results_stream("jobs")
    sizes = {"a": 2, "b": 2, "x": 30_000, "d": 2, "e": 2}  # x: 120 KB
    batch = [(result(rid, np.ones(n, np.float32)), stream) for rid, n in sizes.items()]
    state = StateWrite(4, names.sequence_state_key("identity", 1, 9), b"after e", 60_000)
    try:
        assert await writer.write_until_done(batch, states=[state]) == 5
    finally:
        await writer.close()
    stored = {rid: await stored_result(redis_client, names.result_key(rid)) for rid in sizes}
    refused = stored.pop("x").error
    assert refused is not None and refused.code == "internal"
    assert "Redis refused to store the result" in refused.message
    assert all(r.outputs[0].to_numpy().tolist() == [1.0, 1.0] for r in stored.values())
    assert await redis_client.get(state.key) == b"after e"  # its index followed its result
    entries: Any = await redis_client.xrange(stream)
    got = [r.id for _, fields in entries for r in decode_results(fields[b"r"], int(fields[b"n"]))]
    assert got == list(sizes)  # each answered on the stream, in order


async def test_a_jobs_answer_keeps_the_clients_id_and_binary_choices(
    settings_for: Callable[..., PlazaSettings],
) -> None:
    settings = settings_for("add_sub")
    a = np.arange(16, dtype=np.int32)
    inputs = [
        {"name": name, "datatype": "INT32", "shape": [1, 16], "data": a.tolist()}
        for name in ("INPUT0", "INPUT1")
    ]
    per_output = {
        "id": "my label",
        "inputs": inputs,
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}, {"name": "OUTPUT1"}],
    }
    all_binary = {"inputs": inputs, "parameters": {"binary_data_output": True}}
    async with running_worker(settings, "add_sub"), http(settings) as client:
        first = (await client.post("/v2/models/add_sub/jobs", json=per_output)).json()
        second = (await client.post("/v2/models/add_sub/jobs", json=all_binary)).json()
        assert first["id"] == "my label"

        header, raw = split_binary(await poll_until_finished(client, first["job_id"]))
        assert header["id"] == "my label" and header["job_id"] == first["job_id"]
        out = {o["name"]: o for o in header["outputs"]}
        assert out["OUTPUT0"]["parameters"]["binary_data_size"] == len(raw) == 64
        assert np.frombuffer(raw, np.int32).tolist() == (2 * a).tolist()
        assert out["OUTPUT1"]["data"] == [0] * 16

        header, raw = split_binary(await poll_until_finished(client, second["job_id"]))
        assert header["id"] == second["job_id"]  # no client id: the job id
        assert all("data" not in o for o in header["outputs"]) and len(raw) == 128


async def test_an_ensemble_steps_id_is_no_job(
    settings_for: Callable[..., PlazaSettings], redis_client: redis.asyncio.Redis
) -> None:
    settings = settings_for("identity")  # no worker: the answers are written here
    names = settings.names
    writer = ResultWriter(redis_client, settings.redis, names)
    try:
        step = result("e1.1", np.zeros(2, np.float32))  # an ensemble request's step 1
        answered = result("sync1", np.zeros(2, np.float32))  # a sync call's answer
        marked = result("job.2", np.zeros(2, np.float32))  # a job that has such an id
        await writer.write([(step, None), (answered, None), (marked, None)])
    finally:
        await writer.close()
    await ResultStore(redis_client, settings.redis, names).mark_submitted(
        "job.2", "identity", ttl_s=60
    )
    async with http(settings) as client:
        missing = await client.get("/v2/jobs/e1.1")
        assert missing.status_code == 404 and missing.json()["code"] == "job_not_found"
        for job_id in ("sync1", "job.2"):
            polled = await client.get(f"/v2/jobs/{job_id}")
            assert polled.status_code == 200 and polled.json()["status"] == "done", job_id
