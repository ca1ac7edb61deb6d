"""The sample models Plaza builds: one recipe per model, in build order."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plaza.modelconfig import BACKEND_PYTHON, PLATFORM_ONNX, PLATFORM_TORCH, ModelSpec
from plaza.samples.basic import add_sub_model, identity_model
from plaza.samples.dag import combine_model, preprocess_model
from plaza.samples.files import atomic_write
from plaza.samples.minilm import minilm_fingerprint, minilm_model, minilm_token_model
from plaza.samples.mlp import mlp_fingerprint, mlp_model
from plaza.samples.python_models import (
    TOKENIZER_FILE,
    python_fingerprint,
    python_writer,
    tokenizer_fingerprint,
    write_tokenizer_model,
)
from plaza.samples.sequence import accumulate_model
from plaza.samples.torchscript import write_mlp_torch

Writer = Callable[[ModelSpec, Path], None]
Fingerprint = Callable[[ModelSpec], dict[str, Any]]


def _no_inputs(spec: ModelSpec) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Recipe:
    """How to build one model file from the model's config.pbtxt."""

    name: str
    platform: str
    """The platform its config must name (the file format this recipe writes)."""
    write: Writer
    revision: int
    """Bump when the builder's output changes for the same inputs."""
    fingerprint: Fingerprint = _no_inputs
    """What else the file depends on (weights, seeds), recorded in the build stamp."""
    needs_torch: bool = False
    companions: tuple[str, ...] = ()
    """Files the writer puts next to the model file; one missing means a rebuild."""


def onnx_writer(make: Callable[[ModelSpec], Any]) -> Writer:
    """A writer that serialises the ModelProto ``make(spec)`` to the model file."""

    def write(spec: ModelSpec, path: Path) -> None:
        atomic_write(path, make(spec).SerializeToString())

    return write


RECIPES: tuple[Recipe, ...] = (
    Recipe("identity", PLATFORM_ONNX, onnx_writer(identity_model), 1),
    Recipe("add_sub", PLATFORM_ONNX, onnx_writer(add_sub_model), 1),
    Recipe("mlp", PLATFORM_ONNX, onnx_writer(mlp_model), 1, mlp_fingerprint),
    Recipe("minilm", PLATFORM_ONNX, onnx_writer(minilm_model), 1, minilm_fingerprint),
    Recipe("mlp_torch", PLATFORM_TORCH, write_mlp_torch, 1, mlp_fingerprint, needs_torch=True),
    # the steps of the sample pipelines (their ensembles have no file)
    Recipe(
        "text_embed_tokenizer",
        BACKEND_PYTHON,
        write_tokenizer_model,
        1,
        tokenizer_fingerprint,
        companions=(TOKENIZER_FILE,),
    ),
    Recipe(
        "text_embed_encoder", PLATFORM_ONNX, onnx_writer(minilm_token_model), 1, minilm_fingerprint
    ),
    Recipe(
        "text_embed_pool",
        BACKEND_PYTHON,
        python_writer("text_embed_pool"),
        1,
        python_fingerprint("text_embed_pool"),
    ),
    Recipe("words", BACKEND_PYTHON, python_writer("words"), 1, python_fingerprint("words")),
    Recipe("preprocess", PLATFORM_ONNX, onnx_writer(preprocess_model), 1),
    Recipe("combine", PLATFORM_ONNX, onnx_writer(combine_model), 1),
    Recipe("accumulate", PLATFORM_ONNX, onnx_writer(accumulate_model), 1),
)
MODEL_NAMES = tuple(r.name for r in RECIPES)


def recipe(name: str) -> Recipe:
    """The recipe of the sample model ``name`` (KeyError when there is none)."""
    return {r.name: r for r in RECIPES}[name]
