"""A small ONNX graph builder, and graph inputs/outputs taken from a model's config.

Graphs are written with ``onnx.helper`` and numpy only, at opset 17 and IR version 8 so that
any onnxruntime >= 1.14 loads them. ``onnx`` is imported inside the functions: importing this
module costs nothing, and a missing ``models`` extra surfaces as a clear BuildError.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from plaza.datatypes import to_numpy_dtype
from plaza.modelconfig import ModelSpec, TensorSpec

OPSET = 17
IR_VERSION = 8
PRODUCER = "plaza-build-models"
BATCH_DIM = "batch"
"""The symbolic name of the leading batch dimension."""


@dataclass
class GraphBuilder:
    """Collects nodes and initializers; every ``op`` call returns its (single) output name."""

    name: str
    nodes: list[Any] = field(default_factory=list)
    initializers: list[Any] = field(default_factory=list)
    _counter: int = 0
    _const_names: set[str] = field(default_factory=set)

    def const(self, name: str, value: np.ndarray[Any, Any] | np.generic | Sequence[int]) -> str:
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
        node_name = f"{op_type}_{self._counter}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], node_name, **attrs))
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


def value_info(tensor: TensorSpec, variable_dims: Sequence[str], batched: bool) -> Any:
    """A graph input/output for a configured tensor: its name and dtype, the batch dim first
    when the model batches, and each ``-1`` dim named by ``variable_dims`` in turn. The
    shape is the model's: ``reshape``'s where the config has one, else ``dims``."""
    from onnx import helper

    names = iter(variable_dims)
    shape: list[int | str] = [BATCH_DIM] if batched else []
    for dim in tensor.dims if tensor.reshape is None else tensor.reshape:
        shape.append(next(names) if dim == -1 else dim)
    elem_type = helper.np_dtype_to_tensor_dtype(to_numpy_dtype(tensor.datatype))
    return helper.make_tensor_value_info(tensor.name, elem_type, shape)


def graph_io(spec: ModelSpec, variable_dims: Sequence[str] = ()) -> tuple[list[Any], list[Any]]:
    """The graph inputs and outputs that ``spec`` (a config.pbtxt) declares."""
    batched = spec.max_batch_size > 0
    inputs = [value_info(t, variable_dims, batched) for t in spec.inputs]
    outputs = [value_info(t, variable_dims, batched) for t in spec.outputs]
    return inputs, outputs


def tensor_names(tensors: Sequence[TensorSpec]) -> list[str]:
    """The configured names, in config order."""
    return [t.name for t in tensors]
