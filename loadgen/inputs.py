"""Request inputs for load: made once, before the clock starts, then cycled.

Synthetic tensors follow the model's config (``make_inputs``); for
``minilm`` there are real sentences tokenised with ``plaza.text.tokenize`` at a fixed pad
length, so every request has the same shape and any of them can share a batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from plaza import reshape as reshaping
from plaza.datatypes import to_numpy_dtype
from plaza.modelconfig import ModelSpec, TensorSpec

InputSet = dict[str, np.ndarray[Any, Any]]
POOL_SIZE = 16


def _input_values(
    tensor: TensorSpec, shape: tuple[int, ...], rng: np.random.Generator
) -> np.ndarray[Any, Any]:
    """Plausible values: ones for an attention mask, in-vocabulary ids, normal floats."""
    dtype = to_numpy_dtype(tensor.datatype)
    if tensor.name == "attention_mask":
        return np.ones(shape, dtype=dtype)
    if tensor.name == "input_ids":
        ids = rng.integers(1000, 30000, shape, dtype=dtype)
        ids[..., 0], ids[..., -1] = 101, 102  # [CLS] ... [SEP]
        return ids
    if dtype.kind in "iu":
        return rng.integers(0, 100, shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def make_inputs(spec: ModelSpec, batch: int, seq_len: int, rng: np.random.Generator) -> InputSet:
    """A batch of inputs for ``spec``: the batch dim first, each -1 dim set to ``seq_len``."""
    feeds = {}
    for tensor in spec.inputs:
        dims = tuple(seq_len if d == -1 else d for d in tensor.dims)
        shape = (batch, *dims) if spec.max_batch_size > 0 else dims
        feeds[tensor.name] = _input_values(tensor, shape, rng)
    return feeds


def model_inputs(spec: ModelSpec, batch: int, seq_len: int, rng: np.random.Generator) -> InputSet:
    """``make_inputs`` in the shapes the model itself takes (its config's ``reshape``): what
    a backend called directly, not through the runner, is given. A stateful model also gets
    its control inputs (each row a sequence's first request: every control true) and zero
    state inputs, as its worker would fill them."""
    batched = spec.max_batch_size > 0
    feeds = reshaping.arrays(
        make_inputs(spec, batch, seq_len, rng), reshaping.to_model(spec.inputs), batched
    )
    rows = (batch,) if batched else ()
    for control in spec.sequence.controls:
        dtype = to_numpy_dtype(control.datatype)
        feeds[control.name] = np.full((*rows, 1), control.true_value, dtype=dtype)
    for state in spec.sequence.states:
        feeds[state.input_name] = np.zeros((*rows, *state.dims), to_numpy_dtype(state.datatype))
    return feeds


_SUBJECTS = ("A man", "The woman", "A child", "The old dog", "Two engineers", "A tired cat")
_VERBS = ("is eating", "paints", "watches", "is repairing", "carries", "describes")
_OBJECTS = (
    "a piece of bread",
    "the red bicycle",
    "a long train in the rain",
    "an old map of Lisbon",
    "the toll plaza at rush hour",
    "a bowl of noodles",
)


def sentences(count: int, seed: int = 0) -> list[str]:
    """``count`` plain English sentences, different from one another, reproducible."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        s, v, o = (rng.integers(len(x)) for x in (_SUBJECTS, _VERBS, _OBJECTS))
        out.append(f"{_SUBJECTS[s]} {_VERBS[v]} {_OBJECTS[o]}.")
    return out


def synthetic_pool(
    spec: ModelSpec, *, rows: int = 1, seq_len: int = 16, count: int = POOL_SIZE, seed: int = 0
) -> list[InputSet]:
    """``count`` input sets of ``rows`` rows each, shaped by the model's config."""
    rng = np.random.default_rng(seed)
    return [make_inputs(spec, rows, seq_len, rng) for _ in range(count)]


def text_pool(
    *, rows: int = 1, pad_to: int = 32, count: int = POOL_SIZE, seed: int = 0
) -> list[InputSet]:
    """minilm inputs: tokenised sentences, ``rows`` per request, padded to ``pad_to``."""
    from plaza.text import tokenize

    texts = sentences(count * rows, seed)
    return [tokenize(texts[i * rows : (i + 1) * rows], pad_to=pad_to) for i in range(count)]


def input_pool(
    spec: ModelSpec, *, rows: int = 1, seq_len: int = 16, count: int = POOL_SIZE, seed: int = 0
) -> list[InputSet]:
    """Text for a model fed token ids and a mask (minilm), synthetic tensors otherwise."""
    names = {t.name for t in spec.inputs}
    if names == {"input_ids", "attention_mask"}:
        return text_pool(rows=rows, pad_to=seq_len, count=count, seed=seed)
    return synthetic_pool(spec, rows=rows, seq_len=seq_len, count=count, seed=seed)
