"""Configs completed from the model itself, for ONNX models (Triton's auto-completed model
configuration): a folder with no config.pbtxt at all, or a config.pbtxt that names no inputs
or no outputs.

The model file of the newest version the config's ``version_policy`` serves (``model.onnx``,
or the config's ``default_model_filename``; the newest version folder holding it when no
served version does, whose load then fails on the missing file) is opened with ONNX Runtime,
graph optimisations off: only its inputs and outputs are read. Triton's rules for ONNX
models:

- the platform is ``onnxruntime_onnx`` when the config names neither platform nor backend;
- when the config names no tensors and ``max_batch_size`` is 0 (or there is no config), the
  model batches if every input and output has a first dimension of free size:
  ``max_batch_size`` 4 (Triton's ``default-max-batch-size``) and ``dynamic_batching`` on
  (unless the config chose another scheduler);
- a batching model's dims are the rest of each shape, another's the whole shape; a
  dimension of free size is -1; element types map to Triton's (``tensor(float)`` ->
  ``TYPE_FP32``, ``tensor(string)`` -> ``TYPE_STRING``, ...);
- dims may not be empty: a batching model's tensor of shape ``[batch]`` (one value a row)
  gets ``dims: [ 1 ]`` and ``reshape: { shape: [ ] }``, as Triton's ONNX Runtime backend
  writes it (clients send and get ``[batch, 1]``);
- what the config names stays as written: its inputs (or outputs) are completed only when
  it names none, and a config that names both is not touched.

The completed config is what the model-config endpoints answer, and is checked as a written
one is. A model Plaza cannot describe this way (an element type without a Triton type, a
scalar input of a model that does not batch) is a ``bad_config`` that asks for the tensors
to be written. A model file is read once per path, size and modification time, so a
repository poll does not open every model again.

A Python backend model (``backend: "python"``, or a folder whose version folders hold
``model.py`` and no ``model.onnx``, with no platform or backend named) is completed instead
by the ``auto_complete_config`` of its newest served version's model.py
(``plaza.autocomplete_python``).
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from plaza import autocomplete_python
from plaza.errors import ConfigError
from plaza.modelconfig import BACKEND_PYTHON, DEFAULT_FILENAMES, version_policy
from plaza.naming import folder_version

MODEL_FILENAME = "model.onnx"
PYTHON_FILENAME = DEFAULT_FILENAMES[BACKEND_PYTHON]
PLATFORM_ONNX = "onnxruntime_onnx"
DEFAULT_MAX_BATCH_SIZE = 4
"""Triton's ``--backend-config=default-max-batch-size``."""

ONNX_TYPES = {
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

"""ONNX Runtime's element types -> Triton's config types."""

Shape = list[int | str | None]
Signature = tuple[list[tuple[str, str, Shape]], list[tuple[str, str, Shape]]]
"""A model's inputs and outputs: (name, ONNX type, shape) each."""


def model_file(
    folder: Path, filename: str = MODEL_FILENAME, served: Collection[int] = ()
) -> Path | None:
    """``filename`` in the newest version folder (``plaza.naming.folder_version``) that has
    it, one of ``served`` where one of those has it, or None."""
    found = [(folder_version(p.parent.name), p) for p in folder.glob(f"*/{filename}")]
    versions = [(v, p) for v, p in found if v is not None]
    preferred = [(v, p) for v, p in versions if v in served]
    return max(preferred or versions)[1] if versions else None


def served_versions(config: mc.ModelConfig, folder: Path, source: str) -> list[int]:
    """The version folders of ``folder`` that ``config``'s version policy serves (checked:
    ConfigError naming the field of one that cannot serve any)."""
    policy = version_policy(config, source)
    if not folder.is_dir():
        return []
    found = (folder_version(p.name) for p in folder.iterdir() if p.is_dir())
    return policy.select([v for v in found if v is not None], quiet=True)


def complete(config: mc.ModelConfig, folder: Path, source: str) -> None:
    """Fill in, from the model file in ``folder``, what an ONNX model's ``config`` leaves
    out (see the module doc); a Python model's config is its ``auto_complete_config``'s;
    any other config is left as it is."""
    served = served_versions(config, folder, source)
    python = _python_model_file(config, folder, served)
    if python is not None:
        if not config.platform and not config.backend:
            config.backend = BACKEND_PYTHON
        autocomplete_python.complete(config, python, source)
        return
    if config.input and config.output:
        return
    if config.platform not in ("", PLATFORM_ONNX) or config.backend not in ("", "onnxruntime"):
        return
    path = model_file(folder, config.default_model_filename or MODEL_FILENAME, served)
    if path is None:
        return  # nothing to read: the config's own checks say what is missing
    inputs, outputs = signature(path)
    if not config.platform and not config.backend:
        config.platform = PLATFORM_ONNX
    untyped = not config.input and not config.output and config.max_batch_size == 0
    if untyped and all(shape and _free(shape[0]) for _, _, shape in inputs + outputs):
        config.max_batch_size = DEFAULT_MAX_BATCH_SIZE
        if config.WhichOneof("scheduling_choice") is None:
            config.dynamic_batching.SetInParent()
    batching = config.max_batch_size > 0
    where = f"{source} (completed from {path})"
    if not config.input:
        _add(config.input, inputs, batching, "input", where)
    if not config.output:
        _add(config.output, outputs, batching, "output", where)


def _python_model_file(config: mc.ModelConfig, folder: Path, served: list[int]) -> Path | None:
    """The model.py of a Python backend model (see the module doc), else None."""
    filename = config.default_model_filename
    if config.backend == BACKEND_PYTHON:
        return model_file(folder, filename or PYTHON_FILENAME, served)
    if config.platform or config.backend:
        return None
    if model_file(folder, filename or MODEL_FILENAME, served):
        return None
    return model_file(folder, filename or PYTHON_FILENAME, served)


def signature(path: Path) -> Signature:
    """``path``'s inputs and outputs (remembered per path, size and modification time)."""
    stat = path.stat()
    return _read(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _read(path: str, size: int, mtime_ns: int) -> Signature:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own types for a file it cannot read
        raise ConfigError(f"{path}: cannot read the model: {exc}", file=path) from exc
    inputs = [(a.name, a.type, list(a.shape)) for a in session.get_inputs()]
    outputs = [(a.name, a.type, list(a.shape)) for a in session.get_outputs()]
    return inputs, outputs


def _free(dim: Any) -> bool:
    return not isinstance(dim, int) or dim < 0


def _add(
    field: Any, items: list[tuple[str, str, Shape]], batching: bool, kind: str, source: str
) -> None:
    for name, onnx_type, shape in items:
        data_type = ONNX_TYPES.get(onnx_type)
        if data_type is None:
            raise ConfigError(
                f"{source}: {kind} {name!r} is {onnx_type}, which has no Triton type: "
                f"write its {kind}s in config.pbtxt",
                file=source,
            )
        rest = shape[1:] if batching else shape
        dims = [d if isinstance(d, int) and d >= 0 else -1 for d in rest]
        if not dims and not batching:
            raise ConfigError(
                f"{source}: {kind} {name!r} is a scalar of a model that does not batch: "
                f"write its {kind}s in config.pbtxt",
                file=source,
            )
        tensor = field.add(name=name, data_type=mc.DataType.Value(data_type), dims=dims or [1])
        if not dims:  # [batch]: one value a row, sent as [batch, 1] (Triton's ORT backend)
            tensor.reshape.SetInParent()
