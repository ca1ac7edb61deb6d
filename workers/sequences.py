"""A stateful model's sequences in the worker: the sequence batcher (``plaza.sequence_batching``)
and what each of its requests runs with.

Before a batch runs, ``prepare`` gives each request the inputs Plaza fills for the model
(``sequence_batching``'s control inputs: START, END, READY, CORRID; and its implicit state
inputs, from what the sequence's previous request left) and asks for the state outputs too.
After it ran, ``complete`` takes the state outputs out of each answer, keeps them for the
sequence's next request, and lets that request become a candidate (``finish``). A request
that was not run is let go (``release``) so its sequence goes on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from plaza.contract import InferResult
from plaza.datatypes import to_numpy_dtype
from plaza.modelconfig import ModelSpec
from plaza.sequence_batching import SequenceBatcher, SequenceFlags, State, Step, sequence_flags
from plaza.sequence_config import CORRID, END, READY, START, SequenceControl
from plaza.tensors import Tensor
from plaza.workers.runner import WorkItem


class SequenceRuns:
    """The sequences of one stateful model on one worker."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec
        self.config = spec.sequence
        self.batcher: SequenceBatcher[WorkItem] = SequenceBatcher(
            spec.sequence, spec.max_batch_size, self._flags
        )
        self._batched = spec.max_batch_size > 0
        self._user_outputs = tuple(o.name for o in spec.outputs)
        self._state_input = {s.output_name: s.input_name for s in spec.sequence.states}
        """Each state output, and the state input it feeds the sequence's next request."""

    def _flags(self, item: WorkItem) -> SequenceFlags:
        return sequence_flags(item.request.parameters, self.spec.name)

    def prepare(self, batch: Sequence[WorkItem]) -> list[WorkItem]:
        """``batch`` (handed out by the batcher, or adopted) with each request's control and
        state inputs added, and the state outputs asked for."""
        return [self._with_step(item, self.batcher.step(item)) for item in batch]

    def alone(self, item: WorkItem) -> WorkItem:
        """``item`` as a sequence of its own (START and END, zero state), outside the
        batcher: a warmup sample."""
        flags = self._flags(item)
        return self._with_step(item, Step(flags.key, start=True, end=True, state=None))

    def _with_step(self, item: WorkItem, step: Step) -> WorkItem:
        req = item.request
        extra = [self._control(c, step) for c in self.config.controls]
        extra += [
            self._state(s.input_name, s.datatype, s.dims, step.state) for s in self.config.states
        ]
        outputs = (req.outputs or self._user_outputs) + self.config.state_outputs
        request = msgspec.structs.replace(req, inputs=req.inputs + tuple(extra), outputs=outputs)
        return dataclasses.replace(item, request=request)

    def _control(self, control: SequenceControl, step: Step) -> Tensor:
        value: Any
        if control.kind == CORRID:
            value = step.key
        elif control.kind == START:
            value = control.true_value if step.start else control.false_value
        elif control.kind == END:
            value = control.true_value if step.end else control.false_value
        else:
            assert control.kind == READY
            value = control.true_value
        shape = (1, 1) if self._batched else (1,)
        array = np.full(shape, value, dtype=to_numpy_dtype(control.datatype))
        return Tensor.from_numpy(control.name, array)

    def _state(
        self, name: str, datatype: str, dims: tuple[int, ...], state: State | None
    ) -> Tensor:
        row = None if state is None else state.get(name)
        if row is None:
            row = np.zeros(dims, dtype=to_numpy_dtype(datatype))
        return Tensor.from_numpy(name, row[np.newaxis] if self._batched else row)

    def complete(
        self, batch: Sequence[WorkItem], results: Sequence[InferResult]
    ) -> list[InferResult]:
        """The answers without the state outputs, whose values each sequence keeps."""
        answers: list[InferResult] = []
        for item, result in zip(batch, results, strict=True):
            if result.error is not None:
                self.batcher.finish(item, None)
                answers.append(result)
                continue
            state: State = {}
            kept: list[Tensor] = []
            for tensor in result.outputs:
                name = self._state_input.get(tensor.name)
                if name is None:
                    kept.append(tensor)
                    continue
                array = np.array(tensor.to_numpy(), copy=True)  # not a view of the batch
                state[name] = array[0] if self._batched else array
            self.batcher.finish(item, state)
            answers.append(msgspec.structs.replace(result, outputs=tuple(kept)))
        return answers

    def release(self, items: Sequence[WorkItem]) -> None:
        """These were handed out and will not run: their sequences go on."""
        for item in items:
            self.batcher.release(item)
