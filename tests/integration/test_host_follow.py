"""A host following the model table, and lazy loading with eviction under a memory budget.

Real Kafka and Redis. The model table is written directly (``ModelTable``: what a gateway's
load and unload write). The budget test's repository holds three simulated models, each
declaring a synthetic size (config parameter ``memory_bytes``: 100 MB) and ``lazy``; the
host's budget (250 MB) fits two. Requests go round robin over all three, so the host must
evict to serve the third: every answer is checked, the accounted bytes are sampled all
along (and recorded at every load and unload) and never pass the budget, and evictions are
counted on the host's /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis.asyncio

from plaza.client import PlazaClient
from plaza.gateway.main import serving as gateway_serving
from plaza.model_control import ModelTable
from plaza.settings import PlazaSettings
from plaza.workers.host import Host
from plaza.workers.model_watch import ModelFollower
from tests.metrics_support import samples, value
from tests.support import make_settings, wait_for

pytestmark = pytest.mark.timeout(300)

MB = 1 << 20

SIMULATED = """
name: "{name}"
backend: "plaza_simulated"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 1000 }}
parameters [
  {{ key: "latency_a_us" value: {{ string_value: "100" }} }},
  {{ key: "latency_b_us" value: {{ string_value: "500" }} }},
  {{ key: "memory_bytes" value: {{ string_value: "{nbytes}" }} }},
  {{ key: "lazy" value: {{ string_value: "{lazy}" }} }}
]
"""


def repository(tmp_path: Path, names: tuple[str, ...], *, lazy: bool, nbytes: int) -> Path:
    root = tmp_path / "repo"
    for name in names:
        (root / name / "1").mkdir(parents=True)
        text = SIMULATED.format(name=name, nbytes=nbytes, lazy=str(lazy).lower())
        (root / name / "config.pbtxt").write_text(text)
    return root


def following(settings: PlazaSettings, **host: object) -> PlazaSettings:
    update = {"models": "*", "follow_model_table": True, "follow_interval_s": 0.2, **host}
    worker = settings.worker.model_copy(update={"worker_id": "fh", "metrics_port": 0})
    return settings.model_copy(
        update={"host": settings.host.model_copy(update=update), "worker": worker}
    )


@contextlib.asynccontextmanager
async def serving(settings: PlazaSettings) -> AsyncIterator[tuple[Host, ModelTable]]:
    client = redis.asyncio.Redis.from_url(settings.redis.url)
    host = Host(settings)
    stop = asyncio.Event()
    await host.start()
    task = asyncio.create_task(host.run_until_stopped(stop))
    try:
        yield host, ModelTable(client, settings.names)
    finally:
        stop.set()
        await task
        await client.aclose()


def follower(host: Host) -> ModelFollower:
    assert host.follower is not None
    return host.follower


def metrics_of(host: Host) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    url = f"http://127.0.0.1:{host.services.metrics.port}/metrics"
    return samples(urllib.request.urlopen(url, timeout=5).read().decode())


async def test_a_host_following_the_table_starts_and_drains_units(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path
) -> None:
    repo = repository(tmp_path, ("m1", "m2"), lazy=False, nbytes=0)
    settings = following(make_settings(kafka_bootstrap, redis_url, unique_id, repository=repo))
    async with serving(settings) as (host, table), PlazaClient(settings) as client:
        watch = follower(host)
        assert watch.state.running == {}  # nothing loaded in the table yet
        await table.load("m1")
        await wait_for(lambda: "m1" in watch.state.running, 60, "m1's unit to start")
        assert "m2" not in watch.state.running
        x = np.arange(4, dtype=np.float32).reshape(1, 4)
        answer = await client.infer("m1", {"INPUT0": x}, timeout_s=60)
        np.testing.assert_array_equal(answer.output("OUTPUT0").to_numpy(), x)
        assert answer.worker == "fh.m1"
        # Queue requests, then unload: the unit answers them all before it stops.
        rows = [np.full((1, 4), i, dtype=np.float32) for i in range(60)]
        ids = [await client.submit("m1", {"INPUT0": r}) for r in rows]
        await table.unload("m1")
        results = [await client.result(i, timeout_s=90) for i in ids]
        for row, result in zip(rows, results, strict=True):
            np.testing.assert_array_equal(result.output("OUTPUT0").to_numpy(), row)
        await wait_for(lambda: "m1" not in watch.state.running, 90, "m1's unit to stop")
        # A new generation reloads: a load of a running model restarts its unit.
        await table.load("m2")
        await wait_for(lambda: "m2" in watch.state.running, 60, "m2's unit to start")
        first = watch.state.running["m2"].unit
        await table.load("m2")
        await wait_for(
            lambda: "m2" in watch.state.running and watch.state.running["m2"].unit is not first,
            60,
            "m2's unit to reload",
        )
        got = metrics_of(host)
        assert value(got, "plaza_host_model_loads", model="m1") == 1
        assert value(got, "plaza_host_model_unloads", model="m1") == 1
        assert value(got, "plaza_host_model_loads", model="m2") == 2


async def test_lazy_models_under_a_budget_that_fits_two_of_three(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path
) -> None:
    names = ("ma", "mb", "mc")
    repo = repository(tmp_path, names, lazy=True, nbytes=100 * MB)
    budget = 250 * MB
    settings = following(
        make_settings(kafka_bootstrap, redis_url, unique_id, repository=repo),
        memory_budget_bytes=budget,
    )
    async with serving(settings) as (host, table), PlazaClient(settings) as client:
        watch = follower(host)
        for name in names:
            await table.load(name)
        # Lazy: nothing loads before a request, but each is servable (a standby entry in
        # its worker registry: what the gateway's readiness counts).
        r = host.services.redis
        keys = [settings.names.worker_registry_key(n) for n in names]

        async def standing_by() -> bool:
            return all([await r.zcard(k) == 1 for k in keys])

        await wait_for(standing_by, 30, "standby entries of the lazy models")
        assert watch.state.running == {}
        sampled: list[int] = []

        async def sample() -> None:
            while True:
                sampled.append(watch.budget.total)
                await asyncio.sleep(0.02)

        sampler = asyncio.create_task(sample())
        try:
            for round_ in range(4):
                xs = {n: np.full((1, 4), 10 * round_ + i, np.float32) for i, n in enumerate(names)}
                answers = await asyncio.gather(
                    *(client.infer(n, {"INPUT0": xs[n]}, timeout_s=120) for n in names)
                )
                for name, answer in zip(names, answers, strict=True):
                    np.testing.assert_array_equal(answer.output("OUTPUT0").to_numpy(), xs[name])
                    assert answer.worker == f"fh.{name}"
        finally:
            sampler.cancel()
        assert sampled and max(sampled) <= budget
        assert watch.memory_samples and max(watch.memory_samples) <= budget
        assert watch.budget.peak <= budget
        assert len(watch.state.running) <= 2
        got = metrics_of(host)
        evictions = sum(value(got, "plaza_host_model_evictions", model=n) or 0 for n in names)
        loads = sum(value(got, "plaza_host_model_loads", model=n) or 0 for n in names)
        assert evictions > 0
        assert loads == evictions + len(watch.state.running)  # every unload was an eviction
        assert value(got, "plaza_host_memory_budget_bytes") == budget
        assert value(got, "plaza_host_memory_bytes") <= budget


async def test_the_gateway_loads_a_lazy_model_ready_and_the_first_request_loads_it(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path
) -> None:
    repo = repository(tmp_path, ("lz",), lazy=True, nbytes=MB)
    base = make_settings(
        kafka_bootstrap,
        redis_url,
        unique_id,
        repository=repo,
        gateway={"model_control_mode": "explicit", "metrics_port": -1},
    )
    settings = following(base)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    try:
        async with (
            serving(settings) as (host, _),
            gateway_serving(settings, http_socket=sock, grpc_port=0) as gw,
            httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=120) as http,
        ):
            watch = follower(host)
            loaded = await http.post("/v2/repository/models/lz/load")
            assert loaded.status_code == 200, loaded.text  # the host's standby entry counts
            assert "lz" not in watch.state.running  # lazy: not loaded before a request
            index = (await http.post("/v2/repository/index")).json()
            assert {"name": "lz", "version": "1", "state": "READY"} in index
            assert (await http.get("/v2/health/ready")).status_code == 200
            body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                                "data": [1.0, 2.0, 3.0, 4.0]}]}  # fmt: skip
            answer = await http.post("/v2/models/lz/infer", json=body)
            assert answer.status_code == 200, answer.text
            assert answer.json()["outputs"][0]["data"] == [1.0, 2.0, 3.0, 4.0]
            assert "lz" in watch.state.running  # the request loaded it
            assert (await http.post("/v2/repository/models/lz/unload")).status_code == 200
            await wait_for(lambda: "lz" not in watch.state.running, 60, "lz to unload")
            key = settings.names.worker_registry_key("lz")

            async def no_entry() -> bool:
                return int(await host.services.redis.zcard(key)) == 0

            await wait_for(no_entry, 30, "lz to leave its worker registry")
    finally:
        sock.close()
