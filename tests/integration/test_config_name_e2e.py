"""Triton's --model-config-name through a gateway and a worker: both read the model's
configs/<name>.pbtxt in place of its config.pbtxt."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np

from plaza.client import PlazaClient
from plaza.settings import PlazaSettings
from tests.support import REPOSITORY, gateway_fronts, running_worker


def identity_with_a_small_config(root: Path) -> Path:
    (root / "identity" / "configs").mkdir(parents=True)
    (root / "identity" / "1").symlink_to(REPOSITORY / "identity" / "1")
    config = (REPOSITORY / "identity" / "config.pbtxt").read_text()
    (root / "identity" / "config.pbtxt").write_text(config)
    small = config.replace("max_batch_size: 64", "max_batch_size: 2")
    assert small != config
    (root / "identity" / "configs" / "small.pbtxt").write_text(small)
    return root


async def test_the_named_config_is_the_one_served(settings: PlazaSettings, tmp_path: Path) -> None:
    root = identity_with_a_small_config(tmp_path / "repo")
    settings = settings.model_copy(update={"repository": root, "model_config_name": "small"})
    async with running_worker(settings, "identity"), gateway_fronts(settings) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url, trust_env=False) as http:
            config = (await http.get("/v2/models/identity/config")).json()
        async with PlazaClient(settings) as client:
            two = await client.infer("identity", {"INPUT0": np.ones((2, 4), np.float32)})
            three = await client.infer(
                "identity", {"INPUT0": np.ones((3, 4), np.float32)}, raise_on_error=False
            )
    assert config["max_batch_size"] == 2
    assert two.output("OUTPUT0").to_numpy().shape == (2, 4)
    assert three.error is not None and three.error.code == "invalid_input"
    assert "outside 1..2" in three.error.message  # the worker read the small config too
