"""``accumulate``: the sample stateful model, a running sum per sequence.

OUTPUT = INPUT + (the sequence's sum so far, or 0 at its START). The sum is the model's
implicit state (``sequence_batching.state``: SUM_IN is fed from the SUM_OUT of the
sequence's previous request), and the control inputs START and READY are filled by Plaza's
sequence batcher, so a client sends only INPUT with its ``sequence_id`` and flags.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from plaza.modelconfig import ModelSpec, TensorSpec
from plaza.samples.errors import BuildError
from plaza.samples.graph import GraphBuilder, graph_io, value_info
from plaza.sequence_config import READY, START


def accumulate_model(spec: ModelSpec) -> Any:
    """total = SUM_IN * (1 - START) + INPUT * READY; OUTPUT = SUM_OUT = total."""
    seq = spec.sequence
    kinds = {c.kind: c for c in seq.controls}
    if len(spec.inputs) != 1 or len(spec.outputs) != 1 or len(seq.states) != 1:
        raise BuildError(f"{spec.name}: needs one input, one output and one state", model=spec.name)
    if set(kinds) != {START, READY}:
        raise BuildError(f"{spec.name}: needs START and READY controls", model=spec.name)
    (source,), (target,), (state,) = spec.inputs, spec.outputs, seq.states
    start, ready = kinds[START].name, kinds[READY].name
    g = GraphBuilder(spec.name)
    one = g.const("one", np.ones((1, 1), dtype=np.int32))
    kept = g.op("Mul", state.input_name, g.op("Sub", one, start))
    total = g.op("Add", kept, g.op("Mul", source.name, ready))
    g.op("Identity", total, out=target.name)
    g.op("Identity", total, out=state.output_name)
    inputs, outputs = graph_io(spec)
    batched = spec.max_batch_size > 0
    extra_in = [TensorSpec(c.name, c.datatype, (1,)) for c in seq.controls]
    extra_in.append(TensorSpec(state.input_name, state.datatype, state.dims))
    inputs += [value_info(t, (), batched) for t in extra_in]
    outputs.append(
        value_info(TensorSpec(state.output_name, state.datatype, state.dims), (), batched)
    )
    return g.model(inputs, outputs, f"Plaza sample: {target.name} = running sum of {source.name}")
