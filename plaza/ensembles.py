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
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

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


class ConfiguredTensor(Protocol):
    """An input or output as configured (``plaza.modelconfig.TensorSpec``)."""

    @property
    def name(self) -> str: ...
    @property
    def datatype(self) -> str: ...
    @property
    def dims(self) -> tuple[int, ...]: ...


class ConfiguredModel(Protocol):
    """A model as configured, as far as its tensors go (``plaza.modelconfig.ModelSpec``)."""

    @property
    def name(self) -> str: ...
    @property
    def max_batch_size(self) -> int: ...
    @property
    def inputs(self) -> Sequence[ConfiguredTensor]: ...
    @property
    def outputs(self) -> Sequence[ConfiguredTensor]: ...
    @property
    def ensemble_steps(self) -> tuple[EnsembleStep, ...]: ...


def nested_models(name: str, steps_of: Callable[[str], tuple[EnsembleStep, ...]]) -> list[str]:
    """The models that ``name`` runs in its steps and, through nested ensembles, theirs,
    each once, in the order first met (``name`` itself left out, even on a cycle).
    ``steps_of``: a model's ensemble steps (() for a model that is no ensemble)."""
    found: dict[str, None] = {}
    todo = [name]
    while todo:
        for step in steps_of(todo.pop(0)):
            if step.model_name != name and step.model_name not in found:
                found[step.model_name] = None
                todo.append(step.model_name)
    return list(found)


def check_nesting(
    name: str, steps_of: Callable[[str], tuple[EnsembleStep, ...]], *, source: str
) -> None:
    """ConfigError naming the cycle when ensembles reached from ``name`` call each other
    (``a -> b -> a``), as Triton refuses such ensembles at load: one request would wait on
    itself."""
    path = _cycle_from(name, steps_of)
    if path is None:
        return
    first = next(s for s in steps_of(name) if s.model_name == path[1])
    start = path.index(path[-1])
    message = f"the ensembles call each other in a cycle: {' -> '.join(path[start:])}"
    if start:
        message += f" (through {' -> '.join(path[: start + 1])})"
    raise _fail(source, f"{_where(first)}.model_name", f"{first.label}: {message}")


def _cycle_from(name: str, steps_of: Callable[[str], tuple[EnsembleStep, ...]]) -> list[str] | None:
    """A path of step models from ``name`` that ends on a model already on it (depth
    first), ``name`` first; None: no cycle."""
    path: list[str] = [name]
    done: set[str] = set()

    def walk(model: str) -> list[str] | None:
        for step in dict.fromkeys(s.model_name for s in steps_of(model)):
            if step in path:
                return [*path, step]
            if step in done:
                continue
            path.append(step)
            found = walk(step)
            if found is not None:
                return found
            path.pop()
            done.add(step)
        return None

    return walk(name)


def check_tensors(
    ensemble: ConfiguredModel, step_models: Mapping[str, ConfiguredModel], *, source: str
) -> None:
    """ConfigError naming the step and tensor where two ends of an edge disagree on the
    datatype or shape, as Triton checks at load: an ensemble input and the step inputs that
    read it, a step output and the step inputs that read it, a step output and the ensemble
    output it is. Shapes compare as clients see them: ``dims`` (a step's ``reshape`` is
    undone on its worker before a tensor leaves it), behind a batch dim when the model
    batches; -1 matches any size. A batching step model must allow the ensemble's
    ``max_batch_size`` (a non-batching one may serve a batching ensemble, as Triton allows,
    where the shapes along its edges agree)."""
    for step in ensemble.ensemble_steps:
        _check_names(step, step_models[step.model_name], source)
        _check_batch_size(ensemble, step, step_models[step.model_name], source)
    made: dict[str, tuple[str, ConfiguredTensor, int]] = {
        t.name: ("ensemble input", t, ensemble.max_batch_size) for t in ensemble.inputs
    }
    for step in ensemble.ensemble_steps:
        model = step_models[step.model_name]
        outputs = {t.name: t for t in model.outputs}
        for key, tensor in step.output_map.items():
            made[tensor] = (f"{step.label} output {key!r}", outputs[key], model.max_batch_size)
    for step in ensemble.ensemble_steps:
        model = step_models[step.model_name]
        inputs = {t.name: t for t in model.inputs}
        for key, tensor in step.input_map.items():
            end = (f"{step.label} input {key!r}", inputs[key], model.max_batch_size)
            _check_edge(made[tensor], end, tensor, source, f"{_where(step)}.input_map")
    for out in ensemble.outputs:
        if out.name in made:
            end = ("the ensemble output", out, ensemble.max_batch_size)
            _check_edge(made[out.name], end, out.name, source, "output")


def _check_names(step: EnsembleStep, model: ConfiguredModel, source: str) -> None:
    """ConfigError for a step that maps a tensor its model does not have."""
    for kind, names, tensors in (
        ("input", step.input_map, model.inputs),
        ("output", step.output_map, model.outputs),
    ):
        known = sorted(t.name for t in tensors)
        unknown = sorted(set(names) - set(known))
        if unknown:
            raise _fail(
                source,
                f"{_where(step)}.{kind}_map",
                f"{step.label}: the model has no {kind} {unknown} (it has {known})",
            )


def _check_batch_size(
    ensemble: ConfiguredModel, step: EnsembleStep, model: ConfiguredModel, source: str
) -> None:
    """ConfigError for a batching step model whose ``max_batch_size`` is below the
    ensemble's: a full batch of the ensemble could not run on it."""
    if 0 < model.max_batch_size < ensemble.max_batch_size:
        raise _fail(
            source,
            "max_batch_size",
            f"{step.label}: the ensemble allows maximum batch size {ensemble.max_batch_size}, "
            f"but model '{step.model_name}' only allows maximum batch size "
            f"{model.max_batch_size}",
        )


def _check_edge(
    source_end: tuple[str, ConfiguredTensor, int],
    target_end: tuple[str, ConfiguredTensor, int],
    tensor: str,
    source: str,
    where: str,
) -> None:
    (made_by, made, made_batch), (read_by, read, read_batch) = source_end, target_end
    if made.datatype != read.datatype:
        raise _fail(
            source,
            where,
            f"ensemble tensor {tensor!r}: {made_by} is {made.datatype}, but {read_by} is "
            f"{read.datatype}",
        )
    made_shape, read_shape = _full_shape(made, made_batch), _full_shape(read, read_batch)
    if not _shapes_match(made_shape, read_shape):
        raise _fail(
            source,
            where,
            f"ensemble tensor {tensor!r}: {made_by} has shape {list(made_shape)}, but "
            f"{read_by} has shape {list(read_shape)} (-1: any size)",
        )


def _full_shape(tensor: ConfiguredTensor, max_batch_size: int) -> tuple[int, ...]:
    """The shape a request holds: ``dims``, behind the batch dim (-1) when batching."""
    return (-1, *tensor.dims) if max_batch_size > 0 else tuple(tensor.dims)


def _shapes_match(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


def _where(step: EnsembleStep) -> str:
    return f"ensemble_scheduling.step[{step.index}]"


_fail = ConfigError.at
