"""``model_metrics`` in config.pbtxt (``plaza.model_metrics``): the buckets of the
first-response histogram a model may set, and the configs refused for them."""

from __future__ import annotations

import logging

import pytest

from plaza.errors import ConfigError
from plaza.model_metrics import warn_unknown_families
from plaza.modelconfig import ModelSpec, parse_model_config
from plaza.workers.response_statistics import FIRST_RESPONSE_BUCKETS_MS, FirstResponses

MS = 1_000_000
BASE = """
name: "m" backend: "python" max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def _control(family: str, buckets: str) -> str:
    return (
        f'{{ metric_identifier: {{ family: "{family}" }} '
        f"histogram_options: {{ buckets: [ {buckets} ] }} }}"
    )


def _config(*controls: str) -> str:
    return BASE + f"model_metrics {{ metric_control: [ {', '.join(controls)} ] }}"


FAMILY = "nv_inference_first_response_histogram_ms"


def _parse(text: str) -> ModelSpec:
    return parse_model_config(text, source="m/config.pbtxt", default_name="m")


def test_without_model_metrics_the_buckets_are_tritons() -> None:
    assert _parse(BASE).first_response_buckets_ms == FIRST_RESPONSE_BUCKETS_MS


def test_a_control_sets_the_buckets_and_a_later_one_of_the_family_wins() -> None:
    spec = _parse(_config(_control(FAMILY, "1, 2.5, 10")))
    assert spec.first_response_buckets_ms == (1.0, 2.5, 10.0)
    later = _parse(_config(_control(FAMILY, "1"), _control(FAMILY, "7, 8")))
    assert later.first_response_buckets_ms == (7.0, 8.0)


@pytest.mark.parametrize(
    ("buckets", "why"),
    [
        ("", "at least one"),
        ("5, 5", "must increase"),
        ("10, 1", "must increase"),
        ("inf", "finite"),
    ],
)
def test_buckets_that_make_no_histogram_are_a_bad_config(buckets: str, why: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _parse(_config(_control(FAMILY, buckets)))
    assert caught.value.code == "bad_config"
    assert caught.value.details["field"] == (
        "model_metrics.metric_control[0].histogram_options.buckets"
    )
    assert why in caught.value.message


def test_a_family_no_model_can_tune_changes_nothing_and_is_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    spec = _parse(_config(_control("nv_inference_count", "1, 2")))
    assert spec.first_response_buckets_ms == FIRST_RESPONSE_BUCKETS_MS
    with caplog.at_level(logging.WARNING, logger="plaza.model_metrics"):
        warn_unknown_families(spec.config)
    assert "'nv_inference_count'" in caplog.text and "ignored" in caplog.text


def test_the_histogram_counts_into_the_bounds_it_was_given() -> None:
    histogram = FirstResponses((1.0, 10.0))
    for ms in (0.5, 1, 3, 20):
        histogram.observe(int(ms * MS))
    assert histogram.cumulative() == [("1.0", 2), ("10.0", 3), ("+Inf", 4)]
