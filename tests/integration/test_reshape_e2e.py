"""Triton's reshape through the whole Kafka path: a real ONNX model whose batched input and
output are [batch] (one value a row), configured as Triton users do (dims [ 1 ], reshape
[ ]), so clients send and get [batch, 1]."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import onnx

from plaza.client import PlazaClient
from plaza.modelconfig import load_model_config
from plaza.samples.graph import GraphBuilder, graph_io
from plaza.settings import PlazaSettings
from tests.support import running_worker

CONFIG = """
name: "scalar_double"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] reshape: { shape: [ ] } } ]
dynamic_batching { max_queue_delay_microseconds: 20000 }
"""


def scalar_double(root: Path) -> Path:
    """A repository holding the model: y = 2x on tensors of shape [batch]."""
    folder = root / "scalar_double"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(CONFIG)
    spec = load_model_config(folder / "config.pbtxt")
    g = GraphBuilder("scalar_double")
    g.op("Mul", "x", g.const("two", np.float32(2.0)), out="y")
    inputs, outputs = graph_io(spec)
    model = g.model(inputs, outputs, "y = 2x, one value a row")
    assert [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim] == ["batch"]
    onnx.save(model, str(folder / "1" / "model.onnx"))
    return root


async def test_clients_send_and_get_dims_while_the_model_runs_on_its_reshape(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    settings = settings.model_copy(update={"repository": scalar_double(tmp_path)})
    sent = [np.array([[1.0]], np.float32), np.array([[2.0], [3.0]], np.float32)]
    async with running_worker(settings, "scalar_double") as worker, PlazaClient(settings) as c:
        results = await asyncio.gather(
            *(c.infer("scalar_double", {"x": x}, timeout_s=60) for x in sent)
        )
    for x, result in zip(sent, results, strict=True):
        assert result.status == "ok", result.error
        y = result.output("y")
        assert y.shape == x.shape  # [rows, 1]: dims, as the client sent
        np.testing.assert_array_equal(y.to_numpy(), 2 * x)
    assert worker.spec.inputs[0].reshape == () and worker.spec.outputs[0].reshape == ()
