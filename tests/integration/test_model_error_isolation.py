"""A model error fails only its culprit: MiniLM on ONNX Runtime, one bad token id in a batch.

The runner with the worker's real ONNX backend, no Kafka: an out-of-range token id makes
ONNX Runtime's Gather fail the whole call, and the runner must find that one request and
answer every batch-mate with its embedding.
"""

from __future__ import annotations

import asyncio

import numpy as np
import onnxruntime as ort

from plaza.client import make_request
from plaza.repository import ModelRepository
from plaza.text import tokenize
from plaza.workers.backends.onnx import OnnxBackend
from plaza.workers.device import CPU
from plaza.workers.runner import BatchRunner, WorkItem
from tests.support import REPOSITORY

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "Kafka partitions spread the load across workers.",
    "Redis streams carry the answers back.",
    "Batches are sized by queue depth.",
]
BAD = 3
"""Index of the request whose token id is far outside MiniLM's vocabulary."""


def test_one_bad_token_id_fails_only_its_own_request() -> None:
    version = ModelRepository(REPOSITORY).served_versions("minilm")[0]
    backend = OnnxBackend(version, CPU, threads=1)
    backend.load()
    tokens = tokenize(SENTENCES, pad_to=16)
    expected = ort.InferenceSession(str(version.path), providers=["CPUExecutionProvider"]).run(
        ["embedding"], tokens
    )[0]
    items = []
    for i in range(len(SENTENCES)):
        ids = tokens["input_ids"][i : i + 1].copy()
        if i == BAD:
            ids[0, 1] = 10**9  # no such token: ONNX Runtime's Gather rejects the whole batch
        inputs = {"input_ids": ids, "attention_mask": tokens["attention_mask"][i : i + 1]}
        items.append(WorkItem(request=make_request("minilm", inputs), rows=1, version=1))
    runner = BatchRunner(version.spec, {version.version: backend})

    results = asyncio.run(runner.run(items))

    assert [r.status for r in results] == ["error" if i == BAD else "ok" for i in range(6)]
    bad = results[BAD].error
    assert bad is not None and bad.code == "model_error"
    for i, result in enumerate(results):
        if i != BAD:
            got = result.output("embedding").to_numpy()
            np.testing.assert_allclose(got[0], expected[i], atol=1e-5)
