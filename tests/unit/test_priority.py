"""The one priority rule (plaza.priority) and the one topic <-> level mapping (Names)."""

from __future__ import annotations

import pytest

from plaza.batching import BatchingPolicy
from plaza.errors import InvalidInput
from plaza.naming import Names
from plaza.priority import settle_level

NAMES = Names(topic_prefix="t.", key_prefix="t:")


@pytest.mark.parametrize(
    ("priority", "expected"),
    [(1, 1), (2, 2), (3, 3), (0, 2), (4, 2), (10**9, 2)],
)
def test_in_range_keeps_its_level_and_zero_or_above_goes_to_the_default(
    priority: int, expected: int
) -> None:
    assert settle_level(priority, levels=3, default_level=2) == expected


def test_without_levels_everything_runs_at_level_zero() -> None:
    assert [settle_level(p, 0, 0) for p in (0, 1, 7)] == [0, 0, 0]


@pytest.mark.parametrize("levels", [0, 3])
def test_a_negative_priority_is_invalid_input(levels: int) -> None:
    with pytest.raises(InvalidInput, match="negative"):
        settle_level(-1, levels, 1 if levels else 0)


def test_an_unset_default_falls_back_to_the_lowest_level() -> None:
    assert settle_level(0, levels=3, default_level=0) == 3


def test_the_batcher_settles_with_the_same_rule() -> None:
    policy = BatchingPolicy(max_batch_size=4, priority_levels=3, default_priority_level=2)
    for priority in (0, 1, 2, 3, 4, 99):
        assert policy.level_of(priority) == settle_level(priority, 3, 2)
    with pytest.raises(InvalidInput):
        policy.level_of(-5)


def test_topics_round_trip_through_names() -> None:
    topics = NAMES.request_topics("mlp", 3)
    assert topics == ["t.infer.mlp", "t.infer.mlp.p2", "t.infer.mlp.p3"]
    assert [NAMES.topic_level("mlp", t) for t in topics] == [0, 2, 3]
    assert NAMES.request_topics("mlp", 0) == ["t.infer.mlp"]
    assert NAMES.request_topic("mlp", 0) == NAMES.request_topic("mlp", 1) == "t.infer.mlp"


@pytest.mark.parametrize(
    "topic",
    ["t.infer.other", "t.infer.mlp.p1", "t.infer.mlp.p02", "t.infer.mlp.px", "u.infer.mlp.p2"],
)
def test_a_topic_that_is_not_the_models_is_refused(topic: str) -> None:
    with pytest.raises(InvalidInput):
        NAMES.topic_level("mlp", topic)


def test_a_model_whose_name_looks_like_a_level_is_still_its_own_base_topic() -> None:
    assert NAMES.topic_level("mlp.p2", NAMES.request_topic("mlp.p2")) == 0
