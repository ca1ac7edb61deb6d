"""An ensemble's graph: its steps, checked as Triton checks them, and the order they may run.

``platform: "ensemble"`` with ``ensemble_scheduling { step [ ... ] }`` (config.pbtxt, parsed
by ``plaza.modelconfig``) describes a DAG over named *ensemble tensors*. Each step runs one
model: its ``input_map`` maps the step model's input names to ensemble tensors, its
``output_map`` maps the step model's output names to ensemble tensors. The ensemble's own
inputs are tensors that exist from the start; its outputs must be produced by some step.

``check_graph`` refuses what Triton refuses, with a ConfigError naming the step and field:
a step input that no one produces, an ensemble tensor produced twice (by two steps, or by
a step and the request), an ensemble output that no step produces, and a cycle. The graph
is pure data; the ensemble runner (``workers/ensemble.py``) executes it, as Triton's
ensemble scheduler does: only the steps the requested outputs need (``needed_by``), and a
step that reads an optional ensemble input the request left out runs without it
(``runnable``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from plaza.errors import ConfigError, PlazaError
from plaza.naming import check_model_name

LATEST_VERSION = -1
"""``model_version: -1``: the step model's newest served version (Triton's default)."""
PRUNINGS_KEPT = 64
"""Requested-output tuples whose ``needed_by`` one ensemble remembers (``pruning``)."""


@dataclass(frozen=True, slots=True)
class EnsembleStep:
    """One step of ``ensemble_scheduling``."""

    index: int
    """Its position in the config (its step id is ``<request id>.<index>``)."""
    model_name: str
    model_version: int
    """-1: the newest served version."""
    input_map: Mapping[str, str] = field(default_factory=dict)
    """Step model input name -> ensemble tensor it reads."""
    output_map: Mapping[str, str] = field(default_factory=dict)
    """Step model output name -> ensemble tensor it writes."""

    @property
    def label(self) -> str:
        """How messages name the step: ``step 1 (model 'mlp')``."""
        return f"step {self.index} (model '{self.model_name}')"

    @property
    def version(self) -> str:
        """The version a step request asks for ("" for the newest)."""
        return "" if self.model_version == LATEST_VERSION else str(self.model_version)


def check_graph(
    steps: tuple[EnsembleStep, ...],
    inputs: Collection[str],
    outputs: Collection[str],
    *,
    source: str,
    ensemble: str,
) -> None:
    """Raise ConfigError unless ``steps`` form a valid DAG from ``inputs`` to ``outputs``."""
    if not steps:
        raise _fail(source, "ensemble_scheduling.step", "an ensemble needs at least one step")
    for step in steps:
        _check_step(step, source, ensemble)
    producer = _producers(steps, inputs, source)
    for step in steps:
        for key, tensor in step.input_map.items():
            if tensor not in producer:
                raise _fail(
                    source,
                    f"{_where(step)}.input_map",
                    f"{step.label}: input {key!r} reads ensemble tensor {tensor!r}, which is "
                    "neither an ensemble input nor any step's output",
                )
    for name in outputs:
        if producer.get(name, -1) < 0:
            raise _fail(source, "output", f"ensemble output {name!r} is not produced by any step")
    _check_acyclic(steps, producer, source)


def _check_step(step: EnsembleStep, source: str, ensemble: str) -> None:
    where = _where(step)
    if not step.model_name:
        raise _fail(source, f"{where}.model_name", "is required")
    try:
        check_model_name(step.model_name)
    except PlazaError as exc:
        raise _fail(source, f"{where}.model_name", exc.message) from exc
    if step.model_name == ensemble:
        raise _fail(source, f"{where}.model_name", f"{step.label}: an ensemble cannot call itself")
    if step.model_version < LATEST_VERSION:
        raise _fail(source, f"{where}.model_version", "must be -1 (latest) or a version number")
    if not step.input_map:
        raise _fail(source, f"{where}.input_map", f"{step.label}: maps no input")
    if not step.output_map:
        raise _fail(source, f"{where}.output_map", f"{step.label}: maps no output")
    for kind, mapping in (("input_map", step.input_map), ("output_map", step.output_map)):
        if any(not k or not v for k, v in mapping.items()):
            raise _fail(source, f"{where}.{kind}", f"{step.label}: an empty tensor name")


def _producers(
    steps: tuple[EnsembleStep, ...], inputs: Collection[str], source: str
) -> dict[str, int]:
    """Ensemble tensor -> the step index that produces it (-1: the request's input)."""
    producer = dict.fromkeys(inputs, -1)
    for step in steps:
        for key, tensor in step.output_map.items():
            earlier = producer.get(tensor)
            if earlier is not None:
                by = "the request (an ensemble input)" if earlier < 0 else f"step {earlier}"
                raise _fail(
                    source,
                    f"{_where(step)}.output_map",
                    f"{step.label}: output {key!r} writes ensemble tensor {tensor!r}, which "
                    f"{by} already produces (each tensor has one producer)",
                )
            producer[tensor] = step.index
    return producer


def _check_acyclic(
    steps: tuple[EnsembleStep, ...], producer: Mapping[str, int], source: str
) -> None:
    """Kahn's algorithm over step -> step edges; the steps left over lie on a cycle."""
    needs = {s.index: {producer[t] for t in s.input_map.values()} - {-1} for s in steps}
    done: set[int] = set()
    ready = [i for i, deps in needs.items() if not deps]
    while ready:
        done.add(ready.pop())
        ready += [
            i for i, deps in needs.items() if i not in done and i not in ready and deps <= done
        ]
    stuck = sorted(set(needs) - done)
    if stuck:
        labels = ", ".join(steps[i].label for i in stuck)
        raise _fail(
            source,
            f"ensemble_scheduling.step[{stuck[0]}].input_map",
            f"the steps form a cycle: {labels} wait on each other's outputs",
        )


def runnable(
    steps: tuple[EnsembleStep, ...],
    have: Collection[str],
    started: Collection[int],
    absent: Collection[str] = (),
) -> list[EnsembleStep]:
    """Steps not started yet whose every input tensor is in ``have`` or ``absent``, in
    config order. ``absent``: the optional ensemble inputs the request left out; a step
    reading one runs without it (as Triton's, whose step model must take it as optional)."""
    return [
        s
        for s in steps
        if s.index not in started and all(t in have or t in absent for t in s.input_map.values())
    ]


def needed_by(steps: tuple[EnsembleStep, ...], outputs: Collection[str]) -> frozenset[int]:
    """The steps (of ``steps``, all of an ensemble's) that make ``outputs`` and, walking
    back, every step whose outputs those read: the only steps a request for ``outputs``
    runs. Triton prunes the others, so a step that feeds only outputs nobody asked for
    costs nothing and fails nothing."""
    producer = {t: s.index for s in steps for t in s.output_map.values()}
    wanted = [producer[t] for t in outputs if t in producer]
    found: set[int] = set()
    while wanted:
        index = wanted.pop()
        if index not in found:
            found.add(index)
            wanted += [producer[t] for t in steps[index].input_map.values() if t in producer]
    return frozenset(found)


def pruning(
    steps: tuple[EnsembleStep, ...], kept: int = PRUNINGS_KEPT
) -> Callable[[tuple[str, ...]], frozenset[int]]:
    """``needed_by`` over one ensemble's ``steps``, remembered per requested-output tuple
    (the least recently used of more than ``kept`` tuples are forgotten): the runner
    prunes every request and every branch of a decoupled step, mostly for the same few
    output sets, and its graph never changes while it serves."""
    return functools.lru_cache(maxsize=kept)(functools.partial(needed_by, steps))


def downstream_of(steps: tuple[EnsembleStep, ...], index: int) -> frozenset[int]:
    """The steps that read what step ``index`` produces, directly or through other steps
    (not ``index`` itself): a decoupled step's responses each run these once
    (``workers/ensemble.py``)."""
    made = set(steps[index].output_map.values())
    found: set[int] = set()
    grew = True
    while grew:
        grew = False
        for step in steps:
            if step.index in found or step.index == index:
                continue
            if made.intersection(step.input_map.values()):
                found.add(step.index)
                made.update(step.output_map.values())
                grew = True
    return frozenset(found)


def _where(step: EnsembleStep) -> str:
    return f"ensemble_scheduling.step[{step.index}]"


_fail = ConfigError.at
