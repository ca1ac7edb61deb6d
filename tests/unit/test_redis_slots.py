"""Redis Cluster hash slots of Plaza's keys: what must travel together shares a hash tag."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from redis.crc import key_slot

from plaza.naming import Names
from plaza.stack import RedisClusterNodes
from plaza.stack.redis_cluster import SLOTS

PREFIXES = [Names(), Names(key_prefix="t1234abcd:"), Names(key_prefix="team-a:plaza:")]


def slot(key: str) -> int:
    return key_slot(key.encode())


@pytest.mark.parametrize("names", PREFIXES)
def test_the_keys_of_one_request_share_a_slot(names: Names) -> None:
    ids = [uuid.uuid4().hex for _ in range(200)] + ["a:b", "with space", "x{y", "ünï"]
    for cid in ids:
        assert slot(names.result_key(cid)) == slot(names.job_key(cid)), cid
    # ... and different requests spread over the slots (no tag shared by all of them)
    assert len({slot(names.result_key(cid)) for cid in ids}) > 150


@pytest.mark.parametrize("names", PREFIXES)
def test_one_models_statistics_hashes_share_a_slot(names: Names) -> None:
    for model in ("mlp", "add_sub", "minilm.v2"):
        slots = {slot(names.model_stats_key(model, v)) for v in ("1", "2", "17", "")}
        assert len(slots) == 1, model
    models = [f"m{i}" for i in range(50)]
    assert len({slot(names.model_stats_key(m, "1")) for m in models}) > 40


@pytest.mark.parametrize("nodes", [1, 2, 3, 5])
def test_the_stack_cluster_splits_every_slot_once(nodes: int, tmp_path: Path) -> None:
    cluster = RedisClusterNodes(tmp_path, port=30000, nodes=nodes)
    ranges = [cluster.slot_range(i) for i in range(nodes)]
    covered = [s for lo, hi in ranges for s in range(lo, hi + 1)]
    assert covered == list(range(SLOTS))
    assert cluster.ports == list(range(30000, 30000 + nodes))
