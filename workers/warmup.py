"""Triton's ``model_warmup``: sample requests each model instance runs once it has loaded,
before its worker joins the model's consumer group.

A backend's first calls are slow (ONNX Runtime sizes its memory arena, a TorchScript model is
optimised on its first runs); warmup spends that time before the worker takes requests, so
the first clients do not. A worker counts as ready (its heartbeat in the model's registry)
only once every sample has run, as Triton shows a model ready only after its warmup.

Each ``model_warmup`` entry is a request of ``batch_size`` rows (for a model that does not
batch, as in Triton, ``batch_size`` requests of the sample, run one by one, at most
``MAX_UNBATCHED_REQUESTS``) with its inputs made of zeros (``zero_data``), random values
(``random_data``, from a fixed seed), or the raw bytes of ``<model>/warmup/<input_data_file>``.
As in Triton, that file holds one batch-1 element, which every row repeats: its first
``dims``' worth of bytes (C order; a longer file is accepted, a shorter one refused), or for
BYTES exactly ``dims``' count of Triton's length-prefixed strings. It is validated as a
request is, runs ``count`` times (at least once) on every instance of every served version,
through the same runner (so ``reshape`` applies), and is not counted in the model's
statistics. A sample of ``batch_size`` 0 (left out) is skipped with an info line, as Triton
skips it. A stateful model's sample is, as Triton's, ``batch_size`` requests of one row
each (the sample's rows in turn), each a sequence of its own (``sequence_id`` 1, 2, ...,
START and END, zero state: the worker adds the control and state inputs), run together as
one batch (one by one for a model that does not batch). Its sample may name those inputs,
as Triton's may (there they override the sequence batcher's): they are left out, since the
worker adds its own. A sample that cannot be made is a ``bad_config`` naming
it; one that fails to run fails the load, as in Triton.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from plaza.client import make_request
from plaza.contract import InferRequest, InferResult
from plaza.datatypes import from_config_type, itemsize, to_numpy_dtype
from plaza.errors import ConfigError, ModelExecutionError, PlazaError
from plaza.modelconfig import ModelSpec
from plaza.repository import file_in
from plaza.tensors import deserialize_bytes
from plaza.validation import validate_request
from plaza.workers.runner import BatchRunner, WorkItem

log = logging.getLogger(__name__)

WARMUP_DIR = "warmup"
"""The folder under a model's folder that holds its ``input_data_file`` files."""

SEED = 0
"""``random_data`` comes from this seed: the same warmup every load."""

MAX_UNBATCHED_REQUESTS = 1024
"""The most requests a sample sends a model that does not batch (its ``batch_size``): a
bound on what a config can make a worker hold and run before it is ready."""


@dataclass(frozen=True, slots=True)
class Sample:
    """One ``model_warmup`` entry, made into a request."""

    name: str
    requests: tuple[InferRequest, ...]
    """What one run of it sends, as one batch: one request of ``batch_size`` rows, or a
    stateful model's ``batch_size`` requests of one row, each a sequence of its own; for a
    model that does not batch, ``batch_size`` requests run one by one."""
    rows: int
    """The rows of each of its requests."""
    count: int
    together: bool = True
    """Its requests run as one batch (False: one by one, a model that does not batch)."""

    @property
    def request(self) -> InferRequest:
        """Its first request (its only one, but for a stateful model's)."""
        return self.requests[0]


def samples(spec: ModelSpec, model_dir: Path) -> list[Sample]:
    """The model's warmup samples as requests; ConfigError for one that cannot be made."""
    rng = np.random.default_rng(SEED)
    made = []
    for i, entry in enumerate(spec.config.model_warmup):
        where = f"{model_dir / 'config.pbtxt'}: model_warmup[{i}] {entry.name!r}"
        if entry.batch_size == 0:  # Triton's "Skipping batch 0 warmup sample"
            log.info("%s: skipping warmup sample %r of batch_size 0", spec.name, entry.name)
            continue
        try:
            made.append(_sample(spec, entry, model_dir, rng))
        except PlazaError as exc:
            raise ConfigError(f"{where}: {exc.message}", field=f"model_warmup[{i}]") from exc
    return made


def _sample(spec: ModelSpec, entry: Any, model_dir: Path, rng: np.random.Generator) -> Sample:
    batching = spec.max_batch_size > 0
    rows = int(entry.batch_size)
    limit = spec.max_batch_size if batching else MAX_UNBATCHED_REQUESTS
    if not 1 <= rows <= limit:
        raise ConfigError(f"batch_size {rows} is outside 1..{limit}")
    if not entry.inputs:
        raise ConfigError("has no inputs")
    per_row = rows if batching else None
    arrays = _arrays(spec, entry, per_row, model_dir, rng)
    count = max(1, int(entry.count))
    if spec.sequence.enabled:
        made = _sequences(spec, entry.name, arrays, per_row, rows)
        return Sample(entry.name, made, 1, count, together=batching)
    request = make_request(spec.name, arrays, correlation_id=f"warmup-{entry.name}")
    validate_request(request, spec)  # InvalidInput: the sample does not fit the model
    if batching:
        return Sample(entry.name, (request,), rows, count)
    return Sample(entry.name, (request,) * rows, 1, count, together=False)


def _arrays(
    spec: ModelSpec,
    entry: Any,
    rows: int | None,
    model_dir: Path,
    rng: np.random.Generator,
) -> dict[str, np.ndarray[Any, Any]]:
    """The sample's inputs, ``rows`` rows each (None: a model that does not batch), but
    a stateful model's control and state inputs, which the worker sets."""
    filled = set(spec.sequence.model_inputs)  # empty unless the model is stateful
    arrays = {}
    for name, data in entry.inputs.items():
        if name in filled:
            log.info(
                "%s: warmup sample %r names %r, a sequence control or state input: the "
                "worker sets it (START and END, zero state), so the sample's value is unused",
                spec.name,
                entry.name,
                name,
            )
            continue
        if spec.input(name) is None:
            raise ConfigError(f"names input {name!r}, which the model does not have")
        datatype = from_config_type(mc.DataType.Name(data.data_type))
        dims = tuple(int(d) for d in data.dims)
        if any(d < 0 for d in dims):
            raise ConfigError(f"input {name!r}: dims {list(dims)} must be sizes, not -1")
        arrays[name] = _values(name, data, datatype, dims, rows, model_dir, rng)
    return arrays


def _sequences(
    spec: ModelSpec,
    name: str,
    arrays: dict[str, np.ndarray[Any, Any]],
    rows: int | None,
    count: int,
) -> tuple[InferRequest, ...]:
    """A stateful model's sample: ``count`` requests, each of the ``rows`` rows of ``arrays``
    in turn (``arrays`` whole where None: a model that does not batch), a sequence of one
    (START and END; the worker adds what it controls) with its own ``sequence_id``, 1 up,
    as Triton's warmup sends ``batch_size`` requests of batch 1."""
    requests = []
    for i in range(count):
        row = arrays if rows is None else {k: a[i : i + 1] for k, a in arrays.items()}
        params = {"sequence_id": i + 1, "sequence_start": True, "sequence_end": True}
        rid = f"warmup-{name}" if count == 1 else f"warmup-{name}-{i + 1}"
        request = make_request(spec.name, row, correlation_id=rid, parameters=params)
        validate_request(request, spec)  # InvalidInput: the sample does not fit the model
        requests.append(request)
    return tuple(requests)


def _values(
    name: str,
    data: Any,
    datatype: str,
    dims: tuple[int, ...],
    rows: int | None,
    model_dir: Path,
    rng: np.random.Generator,
) -> np.ndarray[Any, Any]:
    """The input's values: ``rows`` rows of ``dims`` (``dims`` alone where ``rows`` is None:
    a model that does not batch)."""
    shape = dims if rows is None else (rows, *dims)
    dtype = to_numpy_dtype(datatype)
    count = int(np.prod(shape))
    kind = data.WhichOneof("input_data_type")
    if kind == "zero_data":
        return np.full(shape, b"", dtype=object) if dtype.kind == "O" else np.zeros(shape, dtype)
    if kind == "random_data":
        if dtype.kind == "O":  # short lower-case words
            words = [rng.integers(97, 123, size=8).astype(np.uint8).tobytes() for _ in range(count)]
            return np.array(words, dtype=object).reshape(shape)
        if dtype.kind == "b":
            return rng.integers(0, 2, size=shape).astype(bool)
        if dtype.kind in "iu":
            return rng.integers(0, 100, size=shape).astype(dtype)
        return rng.random(size=shape).astype(dtype)
    if kind == "input_data_file":
        element = _from_file(name, data.input_data_file, dtype, datatype, dims, model_dir)
        # Triton's sample is batch_size requests of this one element: here, that many rows
        return element if rows is None else np.repeat(element[np.newaxis], rows, axis=0)
    raise ConfigError(f"input {name!r}: one of zero_data, random_data, input_data_file is needed")


def _from_file(
    name: str,
    filename: str,
    dtype: np.dtype[Any],
    datatype: str,
    dims: tuple[int, ...],
    model_dir: Path,
) -> np.ndarray[Any, Any]:
    """One batch-1 element of ``dims`` from the file, read as Triton reads it: its first
    bytes (more are ignored; fewer are an error), or for BYTES the whole file, which must
    hold exactly the element's count of length-prefixed strings."""
    path = file_in(model_dir / WARMUP_DIR, filename)
    if path is None:
        raise ConfigError(f"input {name!r}: input_data_file {filename!r} is not a file name")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"input {name!r}: cannot read {path}: {exc.strerror}") from exc
    count = int(np.prod(dims))
    if dtype.kind == "O":
        return deserialize_bytes(raw, count).reshape(dims)
    expected = count * itemsize(datatype)
    if len(raw) < expected:
        raise ConfigError(
            f"input {name!r}: {path} has {len(raw)} bytes; one element of dims {list(dims)} "
            f"of {datatype} needs {expected}"
        )
    return np.frombuffer(raw, dtype=dtype, count=count).reshape(dims)


def run(
    runner: BatchRunner,
    version: int,
    made: list[Sample],
    prepare: Callable[[WorkItem], WorkItem] | None = None,
) -> None:
    """Run every sample ``count`` times on ``runner``'s backend of ``version`` (blocking: in
    the instance's executor thread); ModelExecutionError when one fails. ``prepare`` gives
    a sample what else the model takes (a stateful model's control and state inputs)."""
    for sample in made:
        items = [WorkItem(request=r, rows=sample.rows, version=version) for r in sample.requests]
        if prepare is not None:
            items = [prepare(item) for item in items]
        groups = [items] if sample.together else [[item] for item in items]
        started = time.monotonic()
        for _ in range(sample.count):
            for group in groups:
                _check(runner, version, sample, runner.run_group(group))
        log.info(
            "%s v%d: warmup sample %r ran %d time(s) in %.1f ms",
            runner.spec.name,
            version,
            sample.name,
            sample.count,
            (time.monotonic() - started) * 1e3,
        )


def _check(runner: BatchRunner, version: int, sample: Sample, results: list[InferResult]) -> None:
    """ModelExecutionError when one of a sample's results is an error."""
    for result in results:
        if result.error is not None:
            raise ModelExecutionError(
                f"model {runner.spec.name!r} version {version}: warmup sample "
                f"{sample.name!r} failed: {result.error.message}"
            )
