"""``plaza up --process-per-model``'s supervisor: a reload is a hand-over of generations, on
real Kafka and Redis.

Each worker process the supervisor starts names the model table's generation it serves in
its registry entry (``worker.generation``), so the gateway's load answers once a worker of
its own generation serves, not on the old worker's heartbeat. A new generation's worker
starts beside the old one; the old stops once the new serves. A config the new worker
refuses (``sim`` with a latency the simulated backend cannot read: the gateway accepts it)
is reported in the model table, so the load answers 400 bad_config, and the old worker
keeps serving. One model, three worker starts: starting a process is slow on two cores.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.asyncio as aioredis

from plaza.model_control import ModelTable, live_generations
from plaza.stack import Deployment
from tests.integration.test_model_control import plaza_with_control
from tests.integration.test_refused_reload_gateway import dims, http_body, reshaped
from tests.support import sim_deployment, wait_for

pytestmark = pytest.mark.timeout(240)

MODEL = "sim"


@pytest.fixture
def deployment(kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path) -> Deployment:
    return sim_deployment(kafka_bootstrap, redis_url, unique_id, tmp_path)


async def test_a_reload_answers_once_its_worker_serves_and_a_refused_one_keeps_the_old(
    deployment: Deployment, tmp_path: Path, redis_client: aioredis.Redis
) -> None:
    table = ModelTable(redis_client, deployment.names)

    async def generations() -> set[int | None]:
        return await live_generations(redis_client, deployment.names, MODEL)

    async with plaza_with_control(
        deployment, tmp_path, model_control_mode="explicit", load_timeout_s=120.0
    ) as (_, http, supervisor):
        loaded = await http.post(f"/v2/repository/models/{MODEL}/load")
        assert loaded.status_code == 200, loaded.text
        first = await table.get(MODEL)
        assert first is not None
        assert first.generation in await generations()  # its worker names its generation
        config = (await http.get(f"/v2/models/{MODEL}/config")).json()
        assert dims(config) == ([16], [16])

        # A reload answers once the new generation's worker serves: its config runs at once.
        body = {"parameters": {"config": reshaped(config, 8)}}
        reloaded = await http.post(f"/v2/repository/models/{MODEL}/load", json=body)
        assert reloaded.status_code == 200, reloaded.text
        second = await table.get(MODEL)
        assert second is not None and second.generation != first.generation
        assert second.generation in await generations()
        assert dims((await http.get(f"/v2/models/{MODEL}/config")).json()) == ([8], [8])

        async def handed_over() -> bool:
            return await generations() == {second.generation}

        # The old worker stops a moment later (until then both share the model's topic).
        await wait_for(handed_over, 90, "the old generation's worker to stop")
        answered = await http.post(f"/v2/models/{MODEL}/infer", json=http_body(8, 2.0))
        assert answered.status_code == 200, answered.text
        assert answered.json()["outputs"][0]["data"] == [2.0] * 8

        # A config the new worker refuses: 400 with its reason; the serving worker stays.
        body = {"parameters": {"config": reshaped(config, 4, latency_a_us="abc")}}
        refused = await http.post(f"/v2/repository/models/{MODEL}/load", json=body)
        assert refused.status_code == 400, refused.text
        assert refused.json()["code"] == "bad_config"
        assert "latency_a_us" in refused.json()["error"]
        assert MODEL not in supervisor.starting
        assert supervisor.running[MODEL].generation == second.generation
        assert await generations() == {second.generation}
        answered = await http.post(f"/v2/models/{MODEL}/infer", json=http_body(8, 3.0))
        assert answered.status_code == 200, answered.text
        assert answered.json()["outputs"][0]["data"] == [3.0] * 8
