"""The ONNX steps of the ``numeric_dag`` ensemble: ``preprocess`` and ``combine``.

``numeric_dag`` runs preprocess -> mlp and preprocess -> identity -> combine: preprocess's
output feeds two steps (fan-out), and combine waits for both branches (fan-in). Tensor names
and widths come from each config.pbtxt.

* ``preprocess``: ``RAW`` FP32 [n] -> ``FEATURES`` FP32 [n], each row standardised to mean 0
  and variance 1 (LayerNormalization without scale or shift, epsilon ``PREPROCESS_EPS``).
* ``combine``: ``LOGITS`` FP32 [k], ``FEATURES`` FP32 [n] -> ``COMBINED`` FP32 [k + n], the
  softmax of the logits followed by the features.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from plaza.modelconfig import ModelSpec
from plaza.samples.errors import BuildError
from plaza.samples.graph import GraphBuilder, graph_io

PREPROCESS_EPS = 1e-5


def _fixed_fp32(spec: ModelSpec, inputs: int, outputs: int) -> list[int]:
    """The widths of the inputs then the outputs; BuildError unless each is FP32 [n]."""
    tensors = (*spec.inputs, *spec.outputs)
    fits = (len(spec.inputs), len(spec.outputs)) == (inputs, outputs) and all(
        t.datatype == "FP32" and len(t.dims) == 1 and t.dims[0] > 0 for t in tensors
    )
    if not fits:
        raise BuildError(
            f"{spec.name}: config.pbtxt must declare {inputs} FP32 input(s) and {outputs} FP32 "
            "output(s), each of a fixed width [n]",
            model=spec.name,
        )
    return [t.dims[0] for t in tensors]


def preprocess_model(spec: ModelSpec) -> Any:
    """FEATURES = (RAW - mean(RAW)) / sqrt(var(RAW) + eps), per row."""
    width, out_width = _fixed_fp32(spec, 1, 1)
    if width != out_width:
        raise BuildError(f"{spec.name}: input and output widths differ", model=spec.name)
    g = GraphBuilder(spec.name)
    g.op(
        "LayerNormalization",
        spec.inputs[0].name,
        g.const("scale", np.ones(width, np.float32)),
        g.const("shift", np.zeros(width, np.float32)),
        axis=-1,
        epsilon=PREPROCESS_EPS,
        out=spec.outputs[0].name,
    )
    inputs, outputs = graph_io(spec)
    return g.model(inputs, outputs, "Plaza sample: each row standardised (mean 0, variance 1)")


def combine_model(spec: ModelSpec) -> Any:
    """COMBINED = concat(softmax(LOGITS), FEATURES) on the last axis."""
    logits, features, combined = _fixed_fp32(spec, 2, 1)
    if combined != logits + features:
        raise BuildError(
            f"{spec.name}: output width {combined} must be {logits} + {features}", model=spec.name
        )
    g = GraphBuilder(spec.name)
    probabilities = g.op("Softmax", spec.inputs[0].name, axis=-1)
    g.op("Concat", probabilities, spec.inputs[1].name, axis=-1, out=spec.outputs[0].name)
    inputs, outputs = graph_io(spec)
    return g.model(inputs, outputs, "Plaza sample: softmax(logits) followed by the features")
