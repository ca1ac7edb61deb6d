"""A config made from the model itself, for an ONNX model whose folder has no config.pbtxt
(Triton's auto-completed model configuration).

The newest numeric version folder's ``model.onnx`` is opened with ONNX Runtime (graph
optimisations off: only its inputs and outputs are read) and the config follows Triton's
rules for ONNX models:

- platform ``onnxruntime_onnx``;
- when every input and output has a first dimension of free size, the model batches:
  ``max_batch_size`` 4 (Triton's ``default-max-batch-size``), ``dynamic_batching`` on, and
  the dims are the rest of each shape; otherwise ``max_batch_size`` 0 and the dims are the
  whole shapes;
- a dimension of free size is -1; element types map to Triton's (``tensor(float)`` ->
  ``TYPE_FP32``, ``tensor(string)`` -> ``TYPE_STRING``, ...).

The made config is what the model-config endpoints answer, and is checked as a written one
is. A model Plaza cannot describe this way (an element type without a Triton type, a scalar
input of a model that does not batch) is a ``bad_config`` that asks for a config.pbtxt.
Reading is remembered per file (path, size and modification time), so a repository poll does
not open every model again.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from plaza.errors import ConfigError
from plaza.modelconfig import ModelSpec, parse_model_config

MODEL_FILENAME = "model.onnx"
DEFAULT_MAX_BATCH_SIZE = 4
"""Triton's ``--backend-config=default-max-batch-size``."""

_TYPES = {
    "tensor(float)": "TYPE_FP32",
    "tensor(double)": "TYPE_FP64",
    "tensor(float16)": "TYPE_FP16",
    "tensor(bool)": "TYPE_BOOL",
    "tensor(int8)": "TYPE_INT8",
    "tensor(int16)": "TYPE_INT16",
    "tensor(int32)": "TYPE_INT32",
    "tensor(int64)": "TYPE_INT64",
    "tensor(uint8)": "TYPE_UINT8",
    "tensor(uint16)": "TYPE_UINT16",
    "tensor(uint32)": "TYPE_UINT32",
    "tensor(uint64)": "TYPE_UINT64",
    "tensor(string)": "TYPE_STRING",
}


def model_file(folder: Path) -> Path | None:
    """The ``model.onnx`` of the newest numeric version folder that has one, or None."""
    versions = [p for p in folder.glob(f"[0-9]*/{MODEL_FILENAME}") if p.parent.name.isdigit()]
    return max(versions, key=lambda p: int(p.parent.name)) if versions else None


def onnx_spec(name: str, path: Path) -> ModelSpec:
    """The spec of the config made from ``path`` (an ONNX model of model ``name``)."""
    stat = path.stat()
    return _made(name, str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _made(name: str, path: str, size: int, mtime_ns: int) -> ModelSpec:
    source = f"{path} (no config.pbtxt: config made from the model)"
    config = _config(name, *_signature(path, source), source)
    text = text_format.MessageToString(config)
    return parse_model_config(text, source=source, default_name=name)


Shape = list[int | str | None]


def _signature(
    path: str, source: str
) -> tuple[list[tuple[str, str, Shape]], list[tuple[str, str, Shape]]]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own types for a file it cannot read
        raise ConfigError(f"{source}: cannot read the model: {exc}", file=path) from exc
    inputs = [(a.name, a.type, list(a.shape)) for a in session.get_inputs()]
    outputs = [(a.name, a.type, list(a.shape)) for a in session.get_outputs()]
    return inputs, outputs


def _free(dim: Any) -> bool:
    return not isinstance(dim, int) or dim < 0


def _config(
    name: str,
    inputs: list[tuple[str, str, Shape]],
    outputs: list[tuple[str, str, Shape]],
    source: str,
) -> mc.ModelConfig:
    tensors = inputs + outputs
    batching = all(shape and _free(shape[0]) for _, _, shape in tensors)
    config = mc.ModelConfig(name=name, platform="onnxruntime_onnx")
    if batching:
        config.max_batch_size = DEFAULT_MAX_BATCH_SIZE
        config.dynamic_batching.SetInParent()
    for kind, items, field in (("input", inputs, config.input), ("output", outputs, config.output)):
        for tensor_name, onnx_type, shape in items:
            data_type = _TYPES.get(onnx_type)
            if data_type is None:
                raise ConfigError(
                    f"{source}: {kind} {tensor_name!r} is {onnx_type}, which has no Triton "
                    "type: write a config.pbtxt",
                    file=source,
                )
            dims = [
                d if isinstance(d, int) and d >= 0 else -1
                for d in (shape[1:] if batching else shape)
            ]
            if not dims and not batching:
                raise ConfigError(
                    f"{source}: {kind} {tensor_name!r} is a scalar of a model that does not "
                    "batch: write a config.pbtxt",
                    file=source,
                )
            field.add(name=tensor_name, data_type=mc.DataType.Value(data_type), dims=dims)
    return config
