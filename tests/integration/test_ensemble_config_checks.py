"""Ensembles checked as Triton checks them at load, on the real Kafka and Redis: one whose
step names a model not in the repository fails to load at the gateway (UNAVAILABLE in the
index, its requests answered at once as any failed model's), and an ensemble whose step is
an ensemble is ready only while the nested one's step models have live workers too (by
ModelControl and by the gateway's model ready endpoint)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import redis.asyncio

from plaza.model_control import ModelControl
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings
from plaza.workers.ensemble import EnsembleRunner
from tests.support import gateway_fronts, running_worker, wait_for, with_model

COPY = """
name: "copy"
backend: "plaza_simulated"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def ensemble(name: str, step: str, key_in: str, key_out: str) -> str:
    return f"""
name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
ensemble_scheduling {{ step [ {{
  model_name: "{step}" model_version: -1
  input_map {{ key: "{key_in}" value: "IN" }} output_map {{ key: "{key_out}" value: "OUT" }}
}} ] }}
"""


def repository(root: Path, **configs: str) -> Path:
    for name, config in configs.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
    return root


@asynccontextmanager
async def running_runner(settings: PlazaSettings, model: str) -> AsyncIterator[EnsembleRunner]:
    runner = EnsembleRunner(with_model(settings, model))
    await runner.start()
    try:
        yield runner
    finally:
        await runner.stop()


async def test_an_ensemble_of_an_unknown_model_fails_to_load_at_the_gateway(
    settings: PlazaSettings, tmp_path: Path, redis_client: redis.asyncio.Redis
) -> None:
    root = repository(
        tmp_path / "repo", copy=COPY, lost=ensemble("lost", "nosuch", "INPUT0", "OUTPUT0")
    )
    gateway = settings.gateway.model_copy(update={"models": "lost,copy"})
    settings = settings.model_copy(update={"repository": root, "gateway": gateway})
    async with (
        gateway_fronts(settings) as gw,
        httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=30) as api,
    ):
        index = (await api.post("/v2/repository/index", json={})).json()
        row = next(r for r in index if r["name"] == "lost")
        assert row["state"] == "UNAVAILABLE"
        assert "step 0 (model 'nosuch')" in row["reason"]
        body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}
        answer = await api.post("/v2/models/lost/infer", json=body)
        assert answer.status_code == 404, answer.text  # at once, as any model failed to load
        assert answer.json()["code"] == "model_not_found"
        assert "failed to load" in answer.json()["error"]
        assert "nosuch" in answer.json()["error"]


async def test_an_outer_ensemble_is_ready_only_while_its_nested_steps_are_served(
    settings: PlazaSettings, tmp_path: Path, redis_client: redis.asyncio.Redis
) -> None:
    root = repository(
        tmp_path / "repo",
        copy=COPY,
        inner=ensemble("inner", "copy", "INPUT0", "OUTPUT0"),
        outer=ensemble("outer", "inner", "IN", "OUT"),
    )
    settings = settings.model_copy(update={"repository": root})
    control = ModelControl(
        redis_client, settings.names, settings.kafka, ModelRepository(root), load_timeout_s=5
    )
    async with (
        running_runner(settings, "inner"),
        running_runner(settings, "outer"),
        gateway_fronts(settings) as gw,
        httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=30) as api,
    ):
        # both runners heartbeat (outer's one step, inner, has a live "worker"), but no
        # worker serves copy: neither ensemble can answer, by the control nor the gateway
        assert not await control.ready("inner", mode="none")
        assert not await control.ready("outer", mode="none")
        assert (await api.get("/v2/models/outer/ready")).status_code != 200
        async with running_worker(settings, "copy"):

            async def outer_ready() -> bool:
                return await control.ready("outer", mode="none")

            async def gateway_says_ready() -> bool:
                return (await api.get("/v2/models/outer/ready")).status_code == 200

            await wait_for(outer_ready, 30, "outer ready once copy has a worker")
            assert await control.ready("inner", mode="none")
            await wait_for(gateway_says_ready, 30, "the gateway's outer ready")
