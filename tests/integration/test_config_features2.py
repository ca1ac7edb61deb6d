"""Through a real worker on real Kafka and Redis: an ONNX model whose optional input is an
overridable initializer loads, and each request gets its own B or the model's (it failed to
load); a warmup sample of ``batch_size`` 0 is skipped (it failed the start)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from plaza.client import PlazaClient
from plaza.settings import PlazaSettings
from tests.support import running_worker
from tests.unit.test_config_features2 import add_model

CONFIG = """
name: "opt" platform: "onnxruntime_onnx" max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] },
        { name: "B" data_type: TYPE_FP32 dims: [ 2 ] optional: true } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
dynamic_batching { max_queue_delay_microseconds: 1000 }
model_warmup [ { name: "unsized"
  inputs { key: "A" value { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } } } ]
"""


def repository(root: Path) -> Path:
    (root / "opt" / "1").mkdir(parents=True)
    add_model(root / "opt" / "1" / "model.onnx")
    (root / "opt" / "config.pbtxt").write_text(CONFIG)
    return root


async def test_requests_override_the_initializer_or_get_its_value(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    settings = settings.model_copy(update={"repository": repository(tmp_path / "r")})
    async with running_worker(settings, "opt"), PlazaClient(settings) as client:

        async def one(i: int) -> list[list[float]]:
            x = {"A": np.full((1, 2), i, np.float32)}
            if i % 2 == 0:
                x["B"] = np.full((1, 2), 100, np.float32)
            result = await client.infer("opt", x, timeout_s=60)
            return result.output("Y").to_numpy().tolist()  # type: ignore[no-any-return]

        got = await asyncio.gather(*(one(i) for i in range(6)))
    assert got == [[[i + (100.0 if i % 2 == 0 else 10.0)] * 2] for i in range(6)]
