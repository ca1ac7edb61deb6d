"""The ``mlp`` sample: input -> Gemm/Relu 1024 -> Gemm/Relu 1024 -> Gemm -> logits.

The input and output widths come from its config.pbtxt (512 and 10 in the committed one);
the hidden widths are fixed here. Weights are He-initialised from a fixed seed, so every
build, and ``mlp_torch`` (plaza.samples.torchscript), holds the same numbers.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from plaza.modelconfig import ModelSpec
from plaza.samples.errors import BuildError
from plaza.samples.graph import GraphBuilder, graph_io

MLP_SEED = 20240517
HIDDEN = (1024, 1024)
DEFAULT_SIZES = (512, *HIDDEN, 10)
"""The layer widths of the committed ``mlp`` and ``mlp_torch`` configs."""

Layers = list[tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]]


def mlp_sizes(spec: ModelSpec) -> tuple[int, ...]:
    """(input width, *hidden, output width) from one FP32 ``[n]`` input and output."""
    shapes_ok = len(spec.inputs) == len(spec.outputs) == 1 and all(
        t.datatype == "FP32" and len(t.dims) == 1 and t.dims[0] > 0
        for t in (*spec.inputs, *spec.outputs)
    )
    if not shapes_ok:
        raise BuildError(
            f"{spec.name}: an MLP needs one FP32 input and one FP32 output of fixed width [n]",
            model=spec.name,
        )
    return (spec.inputs[0].dims[0], *HIDDEN, spec.outputs[0].dims[0])


def mlp_weights(seed: int = MLP_SEED, sizes: tuple[int, ...] = DEFAULT_SIZES) -> Layers:
    """The layers as (weight [out, in], bias [out]) float32 pairs, torch Linear layout.

    Weights are He-initialised (normal, std sqrt(2 / fan_in)); biases are small (std 0.01)
    rather than zero so that tests see them. Same seed, same numbers.
    """
    rng = np.random.default_rng(seed)
    layers: Layers = []
    for fan_in, fan_out in itertools.pairwise(sizes):
        weight = rng.standard_normal((fan_out, fan_in), dtype=np.float32)
        weight *= np.float32(np.sqrt(2.0 / fan_in))
        bias = rng.standard_normal(fan_out, dtype=np.float32) * np.float32(0.01)
        layers.append((weight, bias))
    return layers


def mlp_fingerprint(spec: ModelSpec) -> dict[str, Any]:
    """What the weights depend on (recorded in the build stamp)."""
    return {"seed": MLP_SEED, "sizes": mlp_sizes(spec)}


def mlp_model(spec: ModelSpec) -> Any:
    """The ONNX MLP for ``spec``: Gemm (transB) and Relu between the hidden layers."""
    sizes = mlp_sizes(spec)
    layers = mlp_weights(MLP_SEED, sizes)
    g = GraphBuilder(spec.name)
    x = spec.inputs[0].name
    for i, (weight, bias) in enumerate(layers):
        last = i == len(layers) - 1
        weight_name = g.const(f"fc{i}.weight", weight)
        bias_name = g.const(f"fc{i}.bias", bias)
        out = spec.outputs[0].name if last else None
        x = g.op("Gemm", x, weight_name, bias_name, out=out, transB=1)
        if not last:
            x = g.op("Relu", x)
    inputs, outputs = graph_io(spec)
    doc = f"Plaza sample MLP {'-'.join(map(str, sizes))}, He init, seed {MLP_SEED}"
    return g.model(inputs, outputs, doc)
