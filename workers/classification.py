r"""Triton's classification extension: an output asked for with ``classification: N`` comes
back as its N largest values instead of its values.

Each is a BYTES string ``value:index``, or ``value:index:label`` when the output has a
``label_filename`` in its config and a label for that index (the file, in the model's
folder, holds one label a line, lines split at ``\n`` only, as Triton's ``std::getline``
splits them, a CRLF's ``\r`` dropped; line i labels index i; an index past the last line
or on an empty line has no label, and its string no ``:label``, as in Triton), largest
first, ties in index order. Values are compared in the output's own datatype, so large
INT64 and UINT64 values keep their order. A batching model's output is classified row by
row (its shape becomes ``[rows, N]``), another's as a whole (``[N]``); N is cut to the
number of values there are. A float prints with six decimals (C's ``%f``, Triton's
``std::to_string``), NaN last; an integer as an integer. Only the datatypes Triton's
``TopkClassifications`` ranks can be classified: the integers, FP32 and FP64
(``plaza.validation.CLASSIFIABLE``). ``validate_request`` refuses the others (BOOL, FP16,
BYTES) as ``invalid_input`` before the request runs, as Triton refuses them (an invalid
argument), so one such request never fails its batch-mates. The batch runner classifies a
model's outputs, the ensemble runner an ensemble's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from plaza.errors import ConfigError
from plaza.modelconfig import ModelSpec
from plaza.repository import file_in
from plaza.tensors import Tensor


def labels(spec: ModelSpec, model_dir: Path) -> dict[str, list[str]]:
    """Each output's labels, from its ``label_filename``; ConfigError naming a file that
    cannot be read, or a name that is not a file of the model's folder."""
    found = {}
    for i, output in enumerate(spec.config.output):
        if not output.label_filename:
            continue
        path = file_in(model_dir, output.label_filename)
        where = f"{model_dir / 'config.pbtxt'}: output[{i}].label_filename"
        if path is None:
            raise ConfigError(f"{where}: {output.label_filename!r} is not a file name")
        try:
            text = path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where}: cannot read {path}: {exc}") from exc
        found[output.name] = _lines(text)
    return found


def _lines(text: str) -> list[str]:
    r"""``text``'s lines as Triton reads a labels file: split at ``\n`` alone (not at the
    other breaks ``str.splitlines`` knows, which would shift every later label), no empty
    line after a final ``\n``; a CRLF file's ``\r`` is dropped."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def classify(tensor: Tensor, count: int, batched: bool, names: Sequence[str] = ()) -> Tensor:
    """``tensor``'s top ``count`` classes, as BYTES strings (labelled from ``names``)."""
    values = tensor.to_numpy()
    rows = values.reshape(values.shape[0], -1) if batched else values.reshape(1, -1)
    top = min(count, rows.shape[1])
    order = np.argsort(_descending(rows), axis=1, kind="stable")[:, :top]
    floating = rows.dtype.kind == "f"
    strings = [
        _entry(row[i], int(i), floating, names)
        for row, picked in zip(rows, order, strict=True)
        for i in picked
    ]
    shape = (rows.shape[0], top) if batched else (top,)
    return Tensor.from_numpy(tensor.name, np.array(strings, dtype=object).reshape(shape))


def _descending(rows: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """A key whose ascending order is ``rows``' descending order, in their own dtype (a
    float64 copy would merge INT64 values above 2**53): a float's negation (NaN stays NaN,
    which sorts last), an integer's bitwise not (order-reversing, and exact where negation
    would overflow an unsigned or the smallest signed value)."""
    key: np.ndarray[Any, Any] = np.negative(rows) if rows.dtype.kind == "f" else np.invert(rows)
    return key


def _entry(value: Any, index: int, floating: bool, names: Sequence[str]) -> bytes:
    shown = f"{float(value):f}" if floating else str(int(value))
    label = f":{names[index]}" if index < len(names) and names[index] else ""
    return f"{shown}:{index}{label}".encode()
