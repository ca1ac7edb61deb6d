"""Real models through the whole Kafka path: MiniLM (ONNX) and the TorchScript MLP."""

from __future__ import annotations

import asyncio

import numpy as np
import onnxruntime as ort
import pytest

from plaza.client import PlazaClient
from plaza.settings import PlazaSettings
from plaza.text import tokenize
from tests.support import REPOSITORY, running_worker

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "Kafka partitions spread the load across workers.",
]


async def test_minilm_embedding_matches_onnxruntime_in_process(settings: PlazaSettings) -> None:
    tokens = tokenize(SENTENCES, pad_to=24)
    session = ort.InferenceSession(
        str(REPOSITORY / "minilm" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    expected = session.run(["embedding"], tokens)[0]
    async with running_worker(settings, "minilm"), PlazaClient(settings) as client:
        # one request per sentence, sent together so the worker batches them
        results = await asyncio.gather(
            *(
                client.infer("minilm", {k: v[i : i + 1] for k, v in tokens.items()}, timeout_s=60)
                for i in range(len(SENTENCES))
            )
        )
    got = np.concatenate([r.output("embedding").to_numpy() for r in results])
    assert got.shape == (4, 384)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    similar, unrelated = got[0] @ got[1], got[0] @ got[2]
    assert similar > unrelated + 0.3


async def test_torchscript_backend_matches_the_onnx_mlp(settings: PlazaSettings) -> None:
    pytest.importorskip("torch", reason="the PyTorch backend needs the torch extra")
    x = np.random.default_rng(7).standard_normal((5, 512)).astype(np.float32)
    async with (
        running_worker(settings, "mlp"),
        running_worker(settings, "mlp_torch"),
        PlazaClient(settings) as client,
    ):
        onnx_out, torch_out = await asyncio.gather(
            client.infer("mlp", {"input": x}, timeout_s=60),
            client.infer("mlp_torch", {"INPUT__0": x}, timeout_s=60),
        )
    np.testing.assert_allclose(
        torch_out.output("OUTPUT__0").to_numpy(),
        onnx_out.output("logits").to_numpy(),
        rtol=1e-4,
        atol=1e-4,
    )
