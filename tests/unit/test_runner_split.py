"""The runner's split of a batch's outputs: each request's tensor is the bytes that
``Tensor.from_numpy`` of its rows gives, whatever the output array's layout."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from plaza.client import make_request
from plaza.modelconfig import parse_model_config
from plaza.tensors import Tensor
from plaza.workers.runner import BatchRunner, WorkItem

SPEC = parse_model_config(
    """
    name: "m" platform: "onnxruntime_onnx" max_batch_size: 16
    input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, 3 ] } ]
    output [ { name: "y" data_type: TYPE_FP32 dims: [ 2, 3 ] },
             { name: "z" data_type: TYPE_INT64 dims: [ 1 ] } ]
    """,
    source="m/config.pbtxt",
    default_name="m",
)


class Shaped:
    """Returns ``y`` in a layout chosen by the test, and ``z`` as the row numbers."""

    def __init__(self, layout: str) -> None:
        self.layout = layout
        self.seen: Any = None

    def infer(self, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
        x = inputs["x"]
        y = x * 10
        if self.layout == "fortran":
            y = np.asfortranarray(y)
        elif self.layout == "big-endian":
            y = y.astype(">f4")
        elif self.layout == "float64":
            y = y.astype(np.float64)
        self.seen = y
        z = np.arange(x.shape[0], dtype=np.int64).reshape(-1, 1)
        return {"y": y, "z": z}


def item(value: float, rows: int, outputs: tuple[str, ...] = ()) -> WorkItem:
    x = np.arange(rows * 6, dtype=np.float32).reshape(rows, 2, 3) + value
    req = make_request("m", {"x": x}, outputs=outputs)
    return WorkItem(request=req, rows=rows, version=1)


@pytest.mark.parametrize("layout", ["c", "fortran", "big-endian", "float64"])
def test_each_request_gets_exactly_its_rows_bytes(layout: str) -> None:
    backend = Shaped(layout)
    runner = BatchRunner(SPEC, {1: backend})  # type: ignore[dict-item]
    items = [item(0, 1), item(100, 3), item(200, 2, outputs=("z",))]
    results = asyncio.run(runner.run(items))
    start = 0
    for it, res in zip(items, results, strict=True):
        rows = backend.seen[start : start + it.rows]
        wanted = ["z"] if it.request.outputs else ["y", "z"]
        assert [t.name for t in res.outputs] == wanted
        for t in res.outputs:
            full = backend.seen if t.name == "y" else np.arange(6).reshape(-1, 1)
            expect = Tensor.from_numpy(t.name, full[start : start + it.rows])
            assert (t.datatype, t.shape) == (expect.datatype, expect.shape)
            assert bytes(t.data) == bytes(expect.data)
        if "y" in wanted:
            y = res.output("y").to_numpy()
            assert np.array_equal(y, rows.astype(y.dtype))
        start += it.rows
