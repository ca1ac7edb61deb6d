"""The JSON every loadgen report is written as: strict JSON, readable by any parser.

A figure that could not be measured (a point with no successful request, a simulation
stopped by its event limit) is NaN in memory; ``json.dumps`` would write it as ``NaN``,
which is not JSON. Here every non-finite number becomes ``null``.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinity in it (at any depth) replaced by None; tuples
    become lists and numpy scalars and arrays plain numbers and lists."""
    if isinstance(value, np.ndarray | np.generic):
        value = value.tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def dumps(doc: Any, *, indent: int | None = 2, sort_keys: bool = False) -> str:
    """``doc`` as strict JSON (non-finite numbers as null); anything else JSON has no type
    for is written as its ``str``."""
    return json.dumps(finite(doc), indent=indent, sort_keys=sort_keys, default=str, allow_nan=False)
