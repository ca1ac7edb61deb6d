"""Triton's classification extension: an output asked for with ``classification: N`` comes
back as its N largest values instead of its values.

Each is a BYTES string ``value:index``, or ``value:index:label`` when the output has a
``label_filename`` in its config (the file, in the model's folder, holds one label a line;
line i labels index i), largest first, ties in index order. A batching model's output is
classified row by row (its shape becomes ``[rows, N]``), another's as a whole (``[N]``); N
is cut to the number of values there are. A float prints with six decimals, as Triton
prints it; an integer or a bool as an integer. Only numeric outputs can be classified:
``validate_request`` refuses the others. The batch runner classifies a model's outputs, the
ensemble runner an ensemble's.
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
            found[output.name] = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where}: cannot read {path}: {exc}") from exc
    return found


def classify(tensor: Tensor, count: int, batched: bool, names: Sequence[str] = ()) -> Tensor:
    """``tensor``'s top ``count`` classes, as BYTES strings (labelled from ``names``)."""
    values = tensor.to_numpy()
    rows = values.reshape(values.shape[0], -1) if batched else values.reshape(1, -1)
    top = min(count, rows.shape[1])
    order = np.argsort(-rows.astype(np.float64), axis=1, kind="stable")[:, :top]
    floating = rows.dtype.kind == "f"
    strings = [
        _entry(row[i], int(i), floating, names)
        for row, picked in zip(rows, order, strict=True)
        for i in picked
    ]
    shape = (rows.shape[0], top) if batched else (top,)
    return Tensor.from_numpy(tensor.name, np.array(strings, dtype=object).reshape(shape))


def _entry(value: Any, index: int, floating: bool, names: Sequence[str]) -> bytes:
    shown = f"{float(value):f}" if floating else str(int(value))
    label = f":{names[index]}" if index < len(names) else ""
    return f"{shown}:{index}{label}".encode()
