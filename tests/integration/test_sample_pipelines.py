"""The sample pipelines on real Kafka and Redis: each step model served by a real worker,
and the two ensembles (``text_embed``, ``numeric_dag``) served by an ensemble runner.

The tokenizer and pooling steps are Triton model.py files (the Python backend); each answers
on its own through its worker. Called one after another through the SDK, and as the
``text_embed`` ensemble through the SDK and HTTP (raw strings in), the three steps give the
sentence-transformers embedding; ``numeric_dag`` (fan-out and fan-in) gives the answer of
its parts run directly (tests/pipeline_reference.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from plaza.client import PlazaClient
from plaza.settings import PlazaSettings
from plaza.text import tokenize
from plaza.workers.ensemble import EnsembleRunner
from tests.integration.test_gateway_http import http
from tests.pipeline_reference import SENTENCES, cosines, numeric_dag_answer, sentence_embeddings
from tests.support import REPOSITORY, make_settings, running_worker, with_model

pytestmark = pytest.mark.timeout(300)
TEXT_EMBED_STEPS = ("text_embed_tokenizer", "text_embed_encoder", "text_embed_pool")
DAG_STEPS = ("preprocess", "mlp", "identity", "combine")


@pytest.fixture
def settings(
    kafka_bootstrap: str, redis_url: str, unique_id: str, redis_client: object
) -> PlazaSettings:
    for model in (*TEXT_EMBED_STEPS, *DAG_STEPS):
        if not next((REPOSITORY / model).glob("1/model.*"), None):
            pytest.skip(f"{model} is not built: python -m plaza.samples")
    for ensemble in ("text_embed", "numeric_dag"):
        if not (REPOSITORY / ensemble / "1").is_dir():
            pytest.skip(f"{ensemble} has no version folder: python -m plaza.samples")
    return make_settings(kafka_bootstrap, redis_url, unique_id)


@contextlib.asynccontextmanager
async def serving(
    settings: PlazaSettings, *models: str, ensemble: str = ""
) -> AsyncIterator[PlazaClient]:
    """A worker of each of ``models`` (and a runner of ``ensemble``), and an SDK client."""
    async with contextlib.AsyncExitStack() as stack:
        for model in models:
            await stack.enter_async_context(running_worker(settings, model))
        if ensemble:
            runner = EnsembleRunner(with_model(settings, ensemble))
            await runner.start()
            stack.push_async_callback(runner.stop)
        yield await stack.enter_async_context(PlazaClient(settings))


def texts(sentences: list[str]) -> np.ndarray[Any, Any]:
    return np.array([[s.encode()] for s in sentences], dtype=np.object_)


async def test_the_tokenizer_step_answers_token_ids(settings: PlazaSettings) -> None:
    async with serving(settings, "text_embed_tokenizer") as client:
        out = (await client.infer("text_embed_tokenizer", {"TEXT": texts(SENTENCES)})).as_numpy()
        bad = await client.infer(
            "text_embed_tokenizer",
            {"TEXT": np.array([[b"\xff"]], dtype=np.object_)},
            raise_on_error=False,
        )
    expected = tokenize(SENTENCES)
    width = expected["input_ids"].shape[1]
    assert out["input_ids"].shape == (len(SENTENCES), 16 * -(-width // 16))
    np.testing.assert_array_equal(out["input_ids"][:, :width], expected["input_ids"])
    np.testing.assert_array_equal(out["attention_mask"][:, :width], expected["attention_mask"])
    assert bad.error is not None and bad.error.code == "invalid_input"
    assert "UTF-8" in bad.error.message


async def test_the_pooling_step_answers_unit_means(settings: PlazaSettings) -> None:
    rng = np.random.default_rng(11)
    tokens = rng.standard_normal((2, 4, 384)).astype(np.float32)
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=np.int64)
    async with serving(settings, "text_embed_pool") as client:
        result = await client.infer(
            "text_embed_pool", {"token_embeddings": tokens, "attention_mask": mask}
        )
    embedding = result.as_numpy()["embedding"]
    means = np.stack([tokens[0, :2].mean(0), tokens[1].mean(0)])
    expected = means / np.linalg.norm(means, axis=1, keepdims=True)
    np.testing.assert_allclose(embedding, expected, atol=1e-5)


async def _embed_step_by_step(client: PlazaClient, sentences: list[str]) -> Any:
    tokens = (await client.infer("text_embed_tokenizer", {"TEXT": texts(sentences)})).as_numpy()
    hidden = (await client.infer("text_embed_encoder", tokens, timeout_s=60)).as_numpy()
    feeds = {
        "token_embeddings": hidden["token_embeddings"],
        "attention_mask": tokens["attention_mask"],
    }
    return (await client.infer("text_embed_pool", feeds)).as_numpy()["embedding"]


async def test_the_three_text_embed_steps_give_the_sentence_transformers_embedding(
    settings: PlazaSettings,
) -> None:
    async with serving(settings, *TEXT_EMBED_STEPS) as client:
        embedding = await _embed_step_by_step(client, SENTENCES)
    assert embedding.shape == (len(SENTENCES), 384)
    assert cosines(embedding, sentence_embeddings(SENTENCES)).min() > 1 - 1e-4


async def test_the_numeric_dag_steps_give_the_parts_answer(settings: PlazaSettings) -> None:
    raw = np.random.default_rng(12).normal(1.0, 3.0, (3, 512)).astype(np.float32)
    async with serving(settings, *DAG_STEPS) as client:
        features = (await client.infer("preprocess", {"RAW": raw})).as_numpy()["FEATURES"]
        logits = (await client.infer("mlp", {"input": features})).as_numpy()["logits"]
        same = (await client.infer("identity", {"INPUT0": features})).as_numpy()["OUTPUT0"]
        feeds = {"LOGITS": logits, "FEATURES": same}
        combined = (await client.infer("combine", feeds)).as_numpy()["COMBINED"]
    np.testing.assert_allclose(combined, numeric_dag_answer(REPOSITORY, raw), atol=1e-5)


async def test_the_text_embed_ensemble_answers_raw_strings_via_the_sdk_and_http(
    settings: PlazaSettings,
) -> None:
    expected = sentence_embeddings(SENTENCES)
    async with serving(settings, *TEXT_EMBED_STEPS, ensemble="text_embed") as client:
        by_sdk = await client.infer("text_embed", {"TEXT": texts(SENTENCES)}, timeout_s=60)
        # one sentence per request, all at once: the steps' workers batch them
        singles = await asyncio.gather(
            *(client.infer("text_embed", {"TEXT": texts([s])}, timeout_s=60) for s in SENTENCES)
        )
        body = {
            "inputs": [
                {
                    "name": "TEXT",
                    "datatype": "BYTES",
                    "shape": [len(SENTENCES), 1],
                    "data": SENTENCES,
                }
            ]
        }
        async with http(settings) as web:
            response = await web.post("/v2/models/text_embed/infer", json=body)
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    assert output["name"] == "embedding" and output["shape"] == [len(SENTENCES), 384]
    by_http = np.asarray(output["data"], dtype=np.float32).reshape(len(SENTENCES), 384)
    one_by_one = np.vstack([r.as_numpy()["embedding"] for r in singles])
    for embedding in (by_sdk.as_numpy()["embedding"], by_http, one_by_one):
        assert embedding.shape == (len(SENTENCES), 384)
        assert cosines(embedding, expected).min() > 1 - 1e-4


async def test_a_text_embed_step_error_names_the_step(settings: PlazaSettings) -> None:
    async with serving(settings, *TEXT_EMBED_STEPS, ensemble="text_embed") as client:
        bad = np.array([[b"\xff\xfe"]], dtype=np.object_)
        result = await client.infer("text_embed", {"TEXT": bad}, raise_on_error=False)
    assert result.error is not None and result.error.code == "invalid_input"
    assert "text_embed_tokenizer" in result.error.message and "UTF-8" in result.error.message


async def test_the_numeric_dag_ensemble_equals_its_parts_via_the_sdk_and_http(
    settings: PlazaSettings,
) -> None:
    raw = np.random.default_rng(13).normal(-2.0, 5.0, (4, 512)).astype(np.float32)
    expected = numeric_dag_answer(REPOSITORY, raw)
    async with serving(settings, *DAG_STEPS, ensemble="numeric_dag") as client:
        by_sdk = (await client.infer("numeric_dag", {"RAW": raw})).as_numpy()["COMBINED"]
        top = await client.infer("numeric_dag", {"RAW": raw}, classification={"COMBINED": 2})
        body = {
            "inputs": [
                {
                    "name": "RAW",
                    "datatype": "FP32",
                    "shape": [4, 512],
                    "data": raw.reshape(-1).tolist(),
                }
            ]
        }
        async with http(settings) as web:
            response = await web.post("/v2/models/numeric_dag/infer", json=body)
    assert response.status_code == 200, response.text
    (output,) = response.json()["outputs"]
    by_http = np.asarray(output["data"], dtype=np.float32).reshape(4, 522)
    # the ensemble classifies its own output (Triton's classification extension)
    assert top.as_numpy()["COMBINED"].astype(str).tolist() == [
        [f"{row[i]:f}:{i}" for i in np.argsort(-row, kind="stable")[:2]] for row in by_sdk
    ]
    np.testing.assert_allclose(by_sdk, expected, atol=1e-5)
    np.testing.assert_allclose(by_http, expected, atol=1e-5)
