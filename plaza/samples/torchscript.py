"""The ``mlp_torch`` sample: the ``mlp`` weights as TorchScript (platform pytorch_libtorch).

torch is optional: it is imported only here, and only when this model is built, so building
(or serving) the ONNX samples never imports it.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from plaza.modelconfig import ModelSpec
from plaza.samples.errors import BuildError
from plaza.samples.mlp import MLP_SEED, mlp_sizes, mlp_weights


def import_torch() -> Any | None:
    """torch, or None when it cannot be imported (the builder's only import of it)."""
    try:
        import torch
    except Exception:  # ImportError, or a broken CUDA build raising OSError
        return None
    return torch


def _scripted_mlp(torch: Any, spec: ModelSpec) -> Any:
    """An nn.Sequential of Linear/ReLU holding the ``mlp`` weights, scripted."""
    nn = torch.nn
    modules: list[Any] = []
    layers = mlp_weights(MLP_SEED, mlp_sizes(spec))
    for i, (weight, bias) in enumerate(layers):
        linear = nn.Linear(weight.shape[1], weight.shape[0])
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(weight))
            linear.bias.copy_(torch.from_numpy(bias))
        modules.append(linear)
        if i < len(layers) - 1:
            modules.append(nn.ReLU())
    return torch.jit.script(nn.Sequential(*modules).eval())


def write_mlp_torch(spec: ModelSpec, path: Path) -> None:
    """Save the scripted MLP to ``path`` (through a temporary file, then an atomic rename)."""
    torch = import_torch()
    if torch is None:
        raise BuildError("torch is not importable", model=spec.name)
    tmp = path.with_name(path.name + ".tmp")
    with warnings.catch_warnings():
        # Recent torch marks torch.jit deprecated; Triton's pytorch_libtorch still loads it.
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(_scripted_mlp(torch, spec), str(tmp))
    os.replace(tmp, path)
