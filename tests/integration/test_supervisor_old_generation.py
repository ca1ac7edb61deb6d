"""``plaza up --process-per-model``'s supervisor, after a refused reload, starts the older
generation again with what it served, on real Kafka and Redis.

``add_sub`` serves version 1; a version folder 2 whose model.onnx ONNX Runtime cannot read
is added and the model reloaded: the reload is refused (400 bad_config) and version 1's
worker serves on. That worker is then killed (SIGKILL, as the OOM killer would): the
supervisor starts that generation again, and its worker loads version 1, the version it
served, not the repository as it is now (its broken version 2), so the model answers again.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from plaza.model_control import ModelTable
from plaza.stack import Deployment
from tests.integration.test_model_control import plaza_with_control
from tests.support import short_session, wait_for

pytestmark = pytest.mark.timeout(240)

MODEL = "add_sub"
BODY: dict[str, Any] = {
    "inputs": [
        {"name": f"INPUT{i}", "shape": [1, 16], "datatype": "INT32", "data": [i + 1] * 16}
        for i in (0, 1)
    ]
}


@pytest.fixture
def deployment(
    kafka_bootstrap: str, redis_url: str, unique_id: str, make_repository: Callable[..., Path]
) -> Deployment:
    repository = make_repository(MODEL)
    made = Deployment(kafka_bootstrap, redis_url, repository, prefix=unique_id, partitions=2)
    return short_session(made)  # the killed worker's partitions move on sooner


async def answers_with_version_1(http: httpx.AsyncClient) -> bool:
    answered = await http.post(f"/v2/models/{MODEL}/infer", json=BODY)
    if answered.status_code != 200:
        return False
    doc: dict[str, Any] = answered.json()
    return bool(doc["model_version"] == "1" and doc["outputs"][0]["data"] == [3] * 16)


async def test_the_older_generation_serves_again_after_a_refused_reload_and_a_kill(
    deployment: Deployment, tmp_path: Path, redis_client: aioredis.Redis
) -> None:
    table = ModelTable(redis_client, deployment.names)
    async with plaza_with_control(
        deployment, tmp_path, model_control_mode="explicit", load_timeout_s=120.0
    ) as (_, http, supervisor):
        loaded = await http.post(f"/v2/repository/models/{MODEL}/load")
        assert loaded.status_code == 200, loaded.text
        first = await table.get(MODEL)
        assert first is not None
        assert await answers_with_version_1(http)

        broken = deployment.repository / MODEL / "2"
        broken.mkdir()
        (broken / "model.onnx").write_text("garbage\n")
        refused = await http.post(f"/v2/repository/models/{MODEL}/load")
        assert refused.status_code == 400, refused.text
        assert refused.json()["code"] == "bad_config"
        assert await answers_with_version_1(http)  # the older generation serves on

        await wait_for(lambda: MODEL in supervisor.running, 30, "the supervisor to see it serve")
        [worker] = supervisor.running[MODEL].workers
        assert supervisor.running[MODEL].generation == first.generation
        assert worker.pid is not None
        os.kill(worker.pid, signal.SIGKILL)
        await wait_for(lambda: not worker.alive, 30, "the killed worker to exit")

        def replaced() -> bool:
            running = supervisor.running.get(MODEL)
            return running is not None and running.workers[0] is not worker

        await wait_for(replaced, 90, "the older generation's worker to serve again")
        assert supervisor.running[MODEL].generation == first.generation

        async def answered() -> bool:
            return await answers_with_version_1(http)

        await wait_for(answered, 60, "the model to answer again with version 1")
        ready = await http.get(f"/v2/models/{MODEL}/ready")
        assert ready.status_code == 200
