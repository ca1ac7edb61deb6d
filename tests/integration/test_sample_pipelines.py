"""The sample pipelines' step models, each served by a real worker on real Kafka and Redis.

The tokenizer and pooling steps are Triton model.py files (the Python backend); each answers
on its own through its worker. Called one after another through the SDK, the three text_embed
steps give the sentence-transformers embedding, and the numeric DAG's four steps give the
answer of its parts run directly (tests/pipeline_reference.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from plaza.client import PlazaClient
from plaza.settings import PlazaSettings
from plaza.text import tokenize
from tests.pipeline_reference import SENTENCES, cosines, numeric_dag_answer, sentence_embeddings
from tests.support import REPOSITORY, make_settings, running_worker

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
    return make_settings(kafka_bootstrap, redis_url, unique_id)


@contextlib.asynccontextmanager
async def serving(settings: PlazaSettings, *models: str) -> AsyncIterator[PlazaClient]:
    async with contextlib.AsyncExitStack() as stack:
        for model in models:
            await stack.enter_async_context(running_worker(settings, model))
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
