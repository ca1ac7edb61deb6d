"""An ensemble's load checks its steps against what their models are loaded with, on real
Kafka and Redis (a gateway and a host that follows the model table): a step model loaded
already counts as its load recorded it (config and versions), not as its folder is now.

- ``sim`` loaded serving version 1, then ``sim/2`` added on disk without a load: an
  ensemble pinned to version 1 loads and answers; one pinned to version 2 is refused.
- ``sim`` loaded with an override that makes its tensors INT32: an INT32 ensemble loads
  and answers; an FP32 one is refused (it would fail every request).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from plaza.settings import PlazaSettings
from plaza.workers.host import Host
from tests.integration.test_host_follow import following
from tests.support import REPOSITORY, gateway_fronts, make_settings

pytestmark = pytest.mark.timeout(240)

ENSEMBLE = """
name: "{name}"
platform: "ensemble"
max_batch_size: 16
input [ {{ name: "INPUT0" data_type: {dtype} dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: {dtype} dims: [ 16 ] }} ]
ensemble_scheduling {{ step [ {{
  model_name: "sim" model_version: {version}
  input_map {{ key: "INPUT0" value: "INPUT0" }} output_map {{ key: "OUTPUT0" value: "OUTPUT0" }}
}} ] }}
"""
ENSEMBLES = {
    "e_v1": ("TYPE_FP32", 1),
    "e_v2": ("TYPE_FP32", 2),
    "e_fp32": ("TYPE_FP32", -1),
    "e_int32": ("TYPE_INT32", -1),
}
INT32_SIM = {
    "backend": "plaza_simulated",
    "max_batch_size": 16,
    "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [16]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [16]}],
}


@pytest.fixture
def settings(kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path) -> PlazaSettings:
    """Mode explicit; ``sim`` (the simulated sample, its newest version served) and the
    ensembles of ``ENSEMBLES``, each one step of sim."""
    root = tmp_path / "repository"
    shutil.copytree(REPOSITORY / "simulated", root / "sim")
    config = (root / "sim" / "config.pbtxt").read_text().replace('"simulated"', '"sim"')
    (root / "sim" / "config.pbtxt").write_text(config)
    for name, (dtype, version) in ENSEMBLES.items():
        (root / name / "1").mkdir(parents=True)
        text = ENSEMBLE.format(name=name, dtype=dtype, version=version)
        (root / name / "config.pbtxt").write_text(text)
    gateway = {"model_control_mode": "explicit", "load_timeout_s": 120, "metrics_port": -1}
    return make_settings(kafka_bootstrap, redis_url, unique_id, repository=root, gateway=gateway)


@contextlib.asynccontextmanager
async def deployment(settings: PlazaSettings) -> AsyncIterator[httpx.AsyncClient]:
    """A host that follows the model table and a gateway; yields a client of the gateway."""
    host = Host(following(settings))
    stop = asyncio.Event()
    await host.start()
    task = asyncio.create_task(host.run_until_stopped(stop))
    try:
        async with (
            gateway_fronts(settings) as gw,
            httpx.AsyncClient(base_url=gw.http_url, trust_env=False, timeout=150) as http,
        ):
            yield http
    finally:
        stop.set()
        await task


def body(datatype: str) -> dict[str, object]:
    return {
        "inputs": [{"name": "INPUT0", "datatype": datatype, "shape": [1, 16], "data": [0] * 16}]
    }


async def load(http: httpx.AsyncClient, name: str, config: object = None) -> httpx.Response:
    params = {} if config is None else {"parameters": {"config": json.dumps(config)}}
    return await http.post(f"/v2/repository/models/{name}/load", json=params)


async def test_a_step_pinned_to_a_version_counts_the_versions_its_model_serves(
    settings: PlazaSettings,
) -> None:
    async with deployment(settings) as http:
        assert (await load(http, "sim")).status_code == 200
        sim = Path(settings.repository) / "sim"
        shutil.copytree(sim / "1", sim / "2")  # on disk, not loaded: sim serves 1
        assert (await load(http, "e_v1")).status_code == 200, "a good ensemble is refused"
        answer = await http.post("/v2/models/e_v1/infer", json=body("FP32"))
        assert answer.status_code == 200, answer.text
        refused = await load(http, "e_v2")
        assert refused.status_code == 400, "an ensemble whose every request fails loads"
        assert refused.json()["code"] == "bad_config"
        assert "version 2 is not served" in refused.json()["error"]


async def test_a_step_loaded_with_an_override_counts_the_config_it_is_loaded_with(
    settings: PlazaSettings,
) -> None:
    async with deployment(settings) as http:
        assert (await load(http, "sim", INT32_SIM)).status_code == 200
        loaded = await load(http, "e_int32")
        assert loaded.status_code == 200, loaded.text
        answer = await http.post("/v2/models/e_int32/infer", json=body("INT32"))
        assert answer.status_code == 200, answer.text
        refused = await load(http, "e_fp32")
        assert refused.status_code == 400, "an ensemble whose every request fails loads"
        assert refused.json()["code"] == "bad_config"
        assert "ensemble input is FP32, but step 0 (model 'sim') input" in refused.json()["error"]
