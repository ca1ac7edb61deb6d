"""A simulated device: batch latency a*n + b, spent sleeping instead of computing.

For scheduling and scale tests apart from compute (the 2 CPUs stay free). Config:
``backend: "plaza_simulated"`` with parameters ``latency_a_us`` (per row) and
``latency_b_us`` (per batch). Every output is a copy of the first input, cast to the output's
datatype and shaped [rows] + output dims (a -1 dim takes the input's size).
"""

from __future__ import annotations

import time

import numpy as np

from plaza.datatypes import to_numpy_dtype
from plaza.errors import ConfigError
from plaza.repository import ModelVersion
from plaza.workers.backends.base import Arrays
from plaza.workers.device import CPU


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

    def load(self) -> None:
        return None

    def infer(self, inputs: Arrays, outputs: list[str]) -> Arrays:
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
            data = np.resize(flat, (rows, width)).astype(to_numpy_dtype(spec.datatype))
            out[name] = data.reshape([rows, *dims])
        return out

    def unload(self) -> None:
        return None
