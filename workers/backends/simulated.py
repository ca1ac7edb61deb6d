"""A simulated device: batch latency a*n + b, spent sleeping instead of computing.

For scheduling and scale tests apart from compute (the 2 CPUs stay free). Config:
``backend: "plaza_simulated"`` with parameters ``latency_a_us`` (per row) and
``latency_b_us`` (per batch). Every output is a copy of the first input, cast to the output's
datatype and shaped [rows] + output dims (a -1 dim takes the input's size); each row's
values are cut or repeated to the output's width, so a row's output is its own input's.

A testing aid, opt-in: with parameter ``abort_on_value`` the process exits at once
(``os._exit(134)``, as an abort would: no cleanup, no answer, no commit) when any input of a
batch holds that value, so tests can show what a record that kills its worker does to the
consumer group.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from plaza.datatypes import to_numpy_dtype
from plaza.errors import ConfigError
from plaza.repository import ModelVersion
from plaza.workers.backends.base import Arrays
from plaza.workers.device import CPU

ABORT_EXIT_CODE = 134
"""The exit status of the simulated crash: what a process killed by SIGABRT reports."""


class SimulatedBackend:
    def __init__(self, mv: ModelVersion) -> None:
        self.mv = mv
        self.device = CPU
        try:
            self.a_us = float(mv.spec.parameters.get("latency_a_us", "0"))
            self.b_us = float(mv.spec.parameters.get("latency_b_us", "0"))
        except ValueError:
            raise ConfigError(
                f"{mv.spec.name}: latency_a_us / latency_b_us must be numbers", field="parameters"
            ) from None
        self.abort_on = _abort_value(mv)

    def load(self) -> None:
        return None

    def infer(self, inputs: Arrays, outputs: list[str]) -> Arrays:
        if self.abort_on is not None and any(_holds(a, self.abort_on) for a in inputs.values()):
            os._exit(ABORT_EXIT_CODE)  # the simulated crash: nothing after this runs
        first = inputs[self.mv.spec.inputs[0].name]
        rows = first.shape[0] if first.ndim else 1
        time.sleep((self.a_us * rows + self.b_us) / 1e6)
        out: Arrays = {}
        for name in outputs:
            spec = self.mv.spec.output(name)
            assert spec is not None
            flat = first.reshape(rows, -1) if first.ndim else first.reshape(1, 1)
            dims = [flat.shape[1] if d == -1 else d for d in spec.dims]
            width = int(np.prod(dims)) if dims else 1
            data = _echo_rows(flat, width).astype(to_numpy_dtype(spec.datatype))
            out[name] = data.reshape([rows, *dims])
        return out

    def unload(self) -> None:
        return None


def _echo_rows(flat: np.ndarray[Any, Any], width: int) -> np.ndarray[Any, Any]:
    """Each row's own values, cut or repeated to ``width`` (never another row's)."""
    if flat.shape[1] == 0:
        return np.zeros((flat.shape[0], width), dtype=flat.dtype)
    return flat[:, np.arange(width) % flat.shape[1]]


def _abort_value(mv: ModelVersion) -> float | None:
    raw = mv.spec.parameters.get("abort_on_value")
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(
            f"{mv.spec.name}: abort_on_value must be a number, not {raw!r}", field="parameters"
        ) from None


def _holds(array: np.ndarray[Any, Any], value: float) -> bool:
    """Whether a numeric input holds ``value`` (BYTES inputs never match)."""
    return array.dtype.kind in "biuf" and bool(np.any(array == value))
