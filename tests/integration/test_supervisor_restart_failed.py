"""``plaza up --process-per-model``'s supervisor restarts what fails for a passing reason, on
real Kafka and Redis.

A worker killed while it serves is started again (after a 1 s back-off), and requests are
answered again; the whole ``plaza up`` does not end. A generation whose worker refused the
model (``sim`` with a latency the simulated backend cannot read, in its config.pbtxt: the
gateway accepts it) is given up, as before; once the operator fixes the file and restarts
(a new supervisor and gateway, the model table kept in Redis), the restarted supervisor
clears the table's mark as it starts and tries that generation once more: it serves, and
the gateway serves the model.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from plaza.model_control import ModelTable, live_generations
from plaza.stack import Deployment
from tests.integration.test_model_control import plaza_with_control
from tests.integration.test_refused_reload_gateway import http_body
from tests.support import short_session, sim_deployment, wait_for

pytestmark = pytest.mark.timeout(240)

MODEL = "sim"


@pytest.fixture
def deployment(kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path) -> Deployment:
    made = sim_deployment(kafka_bootstrap, redis_url, unique_id, tmp_path)
    return short_session(made)  # the killed worker's partitions move on sooner


def set_latency(deployment: Deployment, latency_a_us: str) -> None:
    config = deployment.repository / MODEL / "config.pbtxt"
    text = config.read_text()
    start = text.index('key: "latency_a_us"')
    end = text.index("}", start)
    value = f'key: "latency_a_us"\n    value: {{ string_value: "{latency_a_us}" '
    config.write_text(text[:start] + value + text[end:])


async def answers(http: httpx.AsyncClient, value: float) -> bool:
    answered = await http.post(f"/v2/models/{MODEL}/infer", json=http_body(16, value))
    return answered.status_code == 200 and answered.json()["outputs"][0]["data"] == [value] * 16


async def test_a_killed_worker_is_started_again(deployment: Deployment, tmp_path: Path) -> None:
    async with plaza_with_control(
        deployment, tmp_path, model_control_mode="explicit", load_timeout_s=120.0
    ) as (_, http, supervisor):
        loaded = await http.post(f"/v2/repository/models/{MODEL}/load")
        assert loaded.status_code == 200, loaded.text
        assert await answers(http, 1.0)
        await wait_for(lambda: MODEL in supervisor.running, 30, "the supervisor to see it serve")
        [worker] = supervisor.running[MODEL].workers
        assert worker.pid is not None
        os.kill(worker.pid, signal.SIGKILL)  # as the kernel's OOM killer would

        async def replaced() -> bool:
            running = supervisor.running.get(MODEL)
            return running is not None and running.workers[0].alive

        await wait_for(lambda: not worker.alive, 30, "the killed worker to exit")
        await wait_for(replaced, 120, "a worker of the model to serve again")
        assert await answers(http, 2.0)


async def test_a_restart_tries_a_refused_generation_once_more(
    deployment: Deployment, tmp_path: Path, redis_client: aioredis.Redis
) -> None:
    table = ModelTable(redis_client, deployment.names)
    set_latency(deployment, "abc")  # the simulated backend refuses it
    async with plaza_with_control(
        deployment, tmp_path / "first", model_control_mode="explicit", load_timeout_s=120.0
    ) as (_, http, supervisor):
        refused = await http.post(f"/v2/repository/models/{MODEL}/load")
        assert refused.status_code == 400, refused.text
        assert refused.json()["code"] == "bad_config"
        assert MODEL not in supervisor.starting and MODEL not in supervisor.running
    failed = await table.get(MODEL)
    assert failed is not None and failed.loaded and "latency_a_us" in failed.failed

    set_latency(deployment, "1000")  # the operator fixes the file, and restarts plaza up

    async def serves() -> bool:
        live = await live_generations(redis_client, deployment.names, MODEL)
        return failed.generation in live and MODEL in supervisor.running

    async with plaza_with_control(
        deployment, tmp_path / "second", model_control_mode="explicit", load_timeout_s=120.0
    ) as (_, http, supervisor):
        now = await table.get(MODEL)  # the restarted supervisor cleared the mark as it started
        assert now is not None and now.generation == failed.generation and now.failed == ""
        await wait_for(serves, 120, "the refused generation to serve after a restart")
        assert supervisor.running[MODEL].generation == failed.generation

        async def answered() -> bool:
            return await answers(http, 3.0)

        await wait_for(answered, 60, "the gateway to serve the model")
