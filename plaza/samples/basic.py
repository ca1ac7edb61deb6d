"""The two smallest samples: ``identity`` and Triton's "simple" example ``add_sub``.

Tensor names, dtypes and shapes are the ones their config.pbtxt declares.
"""

from __future__ import annotations

from typing import Any

from plaza.modelconfig import ModelSpec
from plaza.samples.errors import BuildError
from plaza.samples.graph import GraphBuilder, graph_io, tensor_names


def _expect_arity(spec: ModelSpec, inputs: int, outputs: int) -> None:
    if (len(spec.inputs), len(spec.outputs)) != (inputs, outputs):
        raise BuildError(
            f"{spec.name}: config.pbtxt must declare {inputs} input(s) and {outputs} output(s), "
            f"it declares {len(spec.inputs)} and {len(spec.outputs)}",
            model=spec.name,
        )


def identity_model(spec: ModelSpec) -> Any:
    """OUTPUT0 = INPUT0 (ONNX Identity); a ``-1`` dim is the graph's ``n``."""
    _expect_arity(spec, 1, 1)
    (source,), (target,) = tensor_names(spec.inputs), tensor_names(spec.outputs)
    g = GraphBuilder(spec.name)
    g.op("Identity", source, out=target)
    inputs, outputs = graph_io(spec, variable_dims=("n",))
    return g.model(inputs, outputs, f"Plaza sample: {target} = {source}")


def add_sub_model(spec: ModelSpec) -> Any:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (Triton's 'simple')."""
    _expect_arity(spec, 2, 2)
    a, b = tensor_names(spec.inputs)
    total, difference = tensor_names(spec.outputs)
    g = GraphBuilder(spec.name)
    g.op("Add", a, b, out=total)
    g.op("Sub", a, b, out=difference)
    inputs, outputs = graph_io(spec)
    return g.model(inputs, outputs, f"Plaza sample: {total} = {a} + {b}, {difference} = {a} - {b}")
