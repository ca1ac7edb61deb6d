"""A stateful model's ``model_warmup`` sample of ``batch_size`` N (``workers/warmup.py``).

Triton sends such a sample as N requests of batch 1, each a sequence of its own. So does
Plaza: each row of the sample a request with its own ``sequence_id`` (START and END, zero
state: the worker adds the control and state inputs), the N run together as one batch, so
the model is warmed at that batch size. A ``batch_size`` past max_batch_size is still a
``bad_config``; one of 0 is skipped, as Triton skips it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plaza.errors import ConfigError
from plaza.modelconfig import ModelSpec, parse_model_config
from plaza.naming import Names
from plaza.workers import warmup
from plaza.workers.runner import BatchRunner
from plaza.workers.sequences import SequenceRuns

MODEL = """
name: "acc" platform: "onnxruntime_onnx" max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] } ]
  state [ { input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
}
model_warmup [ { name: "seq" batch_size: %d count: 2
  inputs { key: "INPUT" value { data_type: TYPE_INT32 dims: [ 1 ] random_data: true } } } ]
"""


def spec(batch_size: int) -> ModelSpec:
    return parse_model_config(MODEL % batch_size, source="acc/config.pbtxt", default_name="acc")


class Recording:
    """A backend that keeps the inputs of each call and sums as ``accumulate`` does."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def infer(self, inputs: dict[str, Any], outputs: list[str]) -> dict[str, Any]:
        self.calls.append({k: np.array(v) for k, v in inputs.items()})
        total = inputs["INPUT"] + inputs["SUM_IN"]
        return {"OUTPUT": total, "SUM_OUT": total}


def test_each_row_of_a_stateful_sample_is_a_sequence_of_its_own(tmp_path: Path) -> None:
    (made,) = warmup.samples(spec(3), tmp_path)
    assert (made.rows, made.count, len(made.requests)) == (1, 2, 3)
    params = [dict(r.parameters) for r in made.requests]
    assert params == [
        {"sequence_id": i, "sequence_start": True, "sequence_end": True} for i in (1, 2, 3)
    ]
    assert len({r.id for r in made.requests}) == 3
    rows = [r.inputs[0].to_numpy() for r in made.requests]
    assert [row.shape for row in rows] == [(1, 1)] * 3
    seeded = np.random.default_rng(warmup.SEED).integers(0, 100, size=(3, 1))
    assert np.concatenate(rows).tolist() == seeded.tolist()  # the sample's rows, in turn


def test_a_stateful_sample_runs_its_sequences_as_one_batch(tmp_path: Path) -> None:
    s = spec(3)
    backend = Recording()
    runner = BatchRunner(s, {1: backend})  # type: ignore[dict-item]
    runs = SequenceRuns(s, Names("t.", "t:"), keep_s=60)
    warmup.run(runner, 1, warmup.samples(s, tmp_path), runs.alone)
    assert len(backend.calls) == 2  # count: 2, each one call of the three sequences
    for call in backend.calls:
        assert call["INPUT"].shape == (3, 1)
        assert call["CORRID"].ravel().tolist() == [1, 2, 3]
        assert call["START"].ravel().tolist() == [1, 1, 1]
        assert call["END"].ravel().tolist() == [1, 1, 1]
        assert call["SUM_IN"].ravel().tolist() == [0, 0, 0]  # zero state: each starts anew


def test_a_stateful_sample_past_the_batch_sizes_is_a_bad_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        warmup.samples(spec(5), tmp_path)
    assert "batch_size 5 is outside 1..4" in info.value.message
    assert info.value.code == "bad_config"


def test_a_stateful_sample_of_batch_size_0_is_skipped(tmp_path: Path) -> None:
    assert warmup.samples(spec(0), tmp_path) == []
