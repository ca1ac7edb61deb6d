"""The step graph as Triton's ensemble scheduler walks it (pure logic, no services): optional
ensemble inputs a request leaves out, pruning to the requested outputs, and the priority an
ensemble request keeps for its steps."""

from __future__ import annotations

import numpy as np
import pytest
import redis.asyncio as aioredis

from plaza.client import make_request
from plaza.ensembles import EnsembleStep, needed_by, runnable
from plaza.errors import InvalidInput
from plaza.modelconfig import parse_model_config
from plaza.producer import Producer
from plaza.settings import PlazaSettings
from plaza.workers.ensemble import step_request


def step(index: int, reads: dict[str, str], writes: dict[str, str]) -> EnsembleStep:
    return EnsembleStep(index, f"m{index}", -1, input_map=reads, output_map=writes)


# X (and the optional B) -> 0 -> mid -> 1 -> OUT1;  X -> 2 -> OUT2;  mid -> 3 -> OUT3
STEPS = (
    step(0, {"IN": "X", "BIAS": "B"}, {"OUT": "mid"}),
    step(1, {"IN": "mid"}, {"OUT": "OUT1"}),
    step(2, {"IN": "X"}, {"OUT": "OUT2"}),
    step(3, {"IN": "mid"}, {"OUT": "OUT3", "AUX": "aux"}),
)


def test_a_step_reading_an_optional_input_left_out_is_runnable() -> None:
    assert [s.index for s in runnable(STEPS, {"X"}, set())] == [2]  # 0 waits for B
    ready = runnable(STEPS, {"X"}, set(), absent={"B"})
    assert [s.index for s in ready] == [0, 2]
    assert [s.index for s in runnable(STEPS, {"X", "mid"}, {0, 2}, absent={"B"})] == [1, 3]


def test_a_step_request_leaves_out_an_input_the_request_left_out() -> None:
    x = np.ones((1, 2), np.float32)
    req = make_request("ens", {"X": x})
    sreq = step_request(req, STEPS[0], {"X": req.inputs[0]}, reply_stream="r", priority=0)
    assert [t.name for t in sreq.inputs] == ["IN"]


@pytest.mark.parametrize(
    ("outputs", "steps"),
    [
        (("OUT1", "OUT2", "OUT3"), {0, 1, 2, 3}),
        (("OUT1",), {0, 1}),
        (("OUT2",), {2}),
        (("OUT3",), {0, 3}),
        (("OUT1", "OUT2"), {0, 1, 2}),
        (("nothing made",), set()),
    ],
)
def test_only_the_steps_the_requested_outputs_need_are_kept(
    outputs: tuple[str, ...], steps: set[int]
) -> None:
    assert needed_by(STEPS, outputs) == steps


CHAIN = """
name: "chain"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [ { model_name: "m" model_version: -1
  input_map { key: "IN" value: "X" } output_map { key: "OUT" value: "Y" } } ] }
"""


def prepared(priority: int) -> tuple[PlazaSettings, str, int]:
    """(settings, topic, priority) of a request to ``chain`` as the producer core sends it."""
    settings = PlazaSettings()
    spec = parse_model_config(CHAIN, source="chain/config.pbtxt", default_name="chain")
    producer = Producer(settings, aioredis.Redis(), reply_stream="r", validate=True)
    req = make_request("chain", {"X": np.ones((1, 2), np.float32)}, priority=priority)
    ready = producer._prepare(req, spec)  # the step of every publish that settles priority
    return settings, ready.topic, ready.req.priority


@pytest.mark.parametrize("priority", [0, 1, 2, 7])
def test_an_ensemble_request_keeps_its_priority_on_the_ensembles_one_topic(
    priority: int,
) -> None:
    """An ensemble has no priority levels: its request is not settled to level 0 (its
    steps settle it against their own levels), and it goes to its one topic."""
    settings, topic, kept = prepared(priority)
    assert kept == priority
    assert topic == settings.names.request_topic("chain")


def test_a_negative_priority_to_an_ensemble_is_still_refused() -> None:
    with pytest.raises(InvalidInput, match="negative"):
        prepared(-1)
