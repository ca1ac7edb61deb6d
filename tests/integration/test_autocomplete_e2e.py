"""An ONNX model dropped into the repository without a config.pbtxt, served end to end: the
gateway answers its made config and metadata, and a worker batches it through Kafka."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
from onnx import TensorProto

from plaza.client import PlazaClient
from plaza.settings import PlazaSettings
from tests.support import gateway_fronts, running_worker
from tests.unit.test_autocomplete import tensor, write_model


async def test_a_model_without_a_config_is_served_with_the_config_made_from_it(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    write_model(
        tmp_path / "echo",
        [tensor("x", TensorProto.FLOAT, ["batch", 3])],
        [tensor("y", TensorProto.FLOAT, ["batch", 3])],
    )
    settings = settings.model_copy(update={"repository": tmp_path})
    rows = [np.full((1, 3), i, np.float32) for i in range(3)]
    async with running_worker(settings, "echo"), gateway_fronts(settings) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url, trust_env=False) as http:
            config = (await http.get("/v2/models/echo/config")).json()
            metadata = (await http.get("/v2/models/echo")).json()
        async with PlazaClient(settings) as client:
            results = await asyncio.gather(*(client.infer("echo", {"x": r}) for r in rows))
    assert config["platform"] == "onnxruntime_onnx" and config["max_batch_size"] == 4
    assert "dynamic_batching" in config
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}]
    for sent, result in zip(rows, results, strict=True):
        np.testing.assert_array_equal(result.output("y").to_numpy(), sent)
