"""``pb_utils.ModelConfig``, what ``auto_complete_config`` gets: its view of the config and
what each method adds, completes or refuses (``workers/backends/pb_model_config.py``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from plaza.workers.backends import pb_utils
from plaza.workers.backends.pb_model_config import ModelConfig

FP32_4 = {"name": "IN", "data_type": "TYPE_FP32", "dims": [4]}


def config(**fields: Any) -> ModelConfig:
    return ModelConfig(json.dumps({"name": "m", "backend": "python", **fields}))


def test_pb_utils_exposes_it() -> None:
    assert pb_utils.ModelConfig is ModelConfig


def test_as_dict_has_triton_fields_and_is_a_copy() -> None:
    made = config(input=[{"name": "IN"}])
    view = made.as_dict()
    assert (view["max_batch_size"], view["output"]) == (0, [])
    assert view["input"] == [{"name": "IN", "data_type": "TYPE_INVALID", "dims": []}]
    view["input"].append(FP32_4)
    view["max_batch_size"] = 99
    assert made.as_dict()["max_batch_size"] == 0
    assert len(made.as_dict()["input"]) == 1


def test_add_input_and_output_append() -> None:
    made = config()
    made.add_input({**FP32_4, "optional": True})
    made.add_output({"name": "OUT", "data_type": "TYPE_INT64", "dims": (2, -1)})
    view = made.as_dict()
    assert view["input"] == [{**FP32_4, "optional": True}]
    assert view["output"] == [{"name": "OUT", "data_type": "TYPE_INT64", "dims": [2, -1]}]


def test_the_same_definition_again_is_a_no_op() -> None:
    made = config(input=[dict(FP32_4)])
    made.add_input(dict(FP32_4))
    made.add_input(dict(FP32_4))
    assert made.as_dict()["input"] == [FP32_4]


def test_a_written_tensor_without_type_or_dims_is_completed() -> None:
    made = config(output=[{"name": "OUT"}])
    made.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [3]})
    assert made.as_dict()["output"] == [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [3]}]


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ({**FP32_4, "data_type": "TYPE_INT32"}, "data_type TYPE_FP32.*gives TYPE_INT32"),
        ({**FP32_4, "dims": [5]}, r"dims \[4\].*gives \[5\]"),
        ({**FP32_4, "optional": False}, "optional True.*gives False"),
    ],
    ids=["data_type", "dims", "optional"],
)
def test_add_input_refuses_another_definition(given: dict[str, Any], why: str) -> None:
    made = config(input=[{**FP32_4, "optional": True}])
    with pytest.raises(ValueError, match=f"model 'm': input 'IN': .*{why}"):
        made.add_input(given)
    assert made.as_dict()["input"] == [{**FP32_4, "optional": True}]


def test_add_output_refuses_another_definition() -> None:
    made = config(output=[{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}])
    with pytest.raises(ValueError, match=r"output 'OUT'.*TYPE_FP32.*TYPE_FP16"):
        made.add_output({"name": "OUT", "data_type": "TYPE_FP16", "dims": [4]})


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ({"name": "IN", "dims": [1]}, r"missing \['data_type'\]"),
        ({"name": "IN", "data_type": "TYPE_FP32"}, r"missing \['dims'\]"),
        ({**FP32_4, "reshape": {"shape": []}}, r"has \['reshape'\]"),
        ("IN", "is a dict"),
    ],
)
def test_add_input_checks_what_it_is_given(given: Any, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        config().add_input(given)


def test_an_output_has_no_optional() -> None:
    with pytest.raises(ValueError, match=r"has \['optional'\]"):
        config().add_output({**FP32_4, "optional": True})


def test_set_max_batch_size_fills_an_unset_one() -> None:
    made = config()
    made.set_max_batch_size(8)
    assert made.as_dict()["max_batch_size"] == 8


def test_set_max_batch_size_refuses_less_than_a_written_one_as_triton_does() -> None:
    made = config(max_batch_size=4)
    made.set_max_batch_size(4)  # the same: fine
    for smaller in (2, 0):
        why = f"max_batch_size 4, auto_complete_config sets a smaller {smaller}"
        with pytest.raises(ValueError, match=why):
            made.set_max_batch_size(smaller)
    assert made.as_dict()["max_batch_size"] == 4
    made.set_max_batch_size(8)  # a larger one replaces it (Triton's rule)
    assert made.as_dict()["max_batch_size"] == 8


@pytest.mark.parametrize("bad", [-1, 2.5, True])
def test_set_max_batch_size_takes_a_count(bad: Any) -> None:
    with pytest.raises(ValueError, match="max_batch_size must be"):
        config().set_max_batch_size(bad)


def test_set_dynamic_batching_turns_it_on_once() -> None:
    made = config(dynamic_batching={"max_queue_delay_microseconds": 100})
    made.set_dynamic_batching()
    assert made.as_dict()["dynamic_batching"] == {"max_queue_delay_microseconds": 100}
    fresh = config()
    fresh.set_dynamic_batching()
    assert fresh.as_dict()["dynamic_batching"] == {}


@pytest.mark.parametrize("scheduler", ["sequence_batching", "ensemble_scheduling"])
def test_set_dynamic_batching_refuses_another_scheduler(scheduler: str) -> None:
    made = config(**{scheduler: {}})
    with pytest.raises(ValueError, match=f"schedules with {scheduler}"):
        made.set_dynamic_batching()
    assert "dynamic_batching" not in made.as_dict()


def test_set_model_transaction_policy() -> None:
    made = config()
    made.set_model_transaction_policy({"decoupled": True})
    made.set_model_transaction_policy({"decoupled": True})
    assert made.as_dict()["model_transaction_policy"] == {"decoupled": True}
    with pytest.raises(ValueError, match="sets decoupled True, auto_complete_config sets False"):
        made.set_model_transaction_policy({"decoupled": False})
    with pytest.raises(ValueError, match="only 'decoupled'"):
        made.set_model_transaction_policy({"decoupled": True, "other": 1})
    assert made.as_dict()["model_transaction_policy"] == {"decoupled": True}


def test_a_dict_is_copied_in() -> None:
    body: dict[str, Any] = {"name": "m", "input": []}
    made = ModelConfig(body)
    made.add_input(dict(FP32_4))
    assert body["input"] == []
