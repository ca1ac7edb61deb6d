"""The response cache's pure parts: the key rule, the slots, the entries, the default
version, and ``response_cache`` in config.pbtxt (its Redis side: tests/integration)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import numpy as np
import pytest
from msgspec.structs import replace

from plaza.contract import InferRequest, InferResult
from plaza.errors import ConfigError, DeadlineExceeded
from plaza.modelconfig import ModelSpec, parse_model_config
from plaza.naming import Names
from plaza.response_cache import (
    DIGEST_BYTES,
    STATS_PENDING_MAX,
    CacheFlushes,
    CacheProbe,
    CacheStatistics,
    DefaultVersions,
    ResponseCache,
    cache_key,
    decode_entry,
    encode_entry,
    slot_of,
)
from plaza.settings import ResponseCacheSettings
from plaza.tensors import Tensor

CONFIG = """
name: "ident"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] },
        { name: "B" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"""


def spec(extra: str = "response_cache { enable: true }") -> ModelSpec:
    return parse_model_config(CONFIG + extra, source="ident/config.pbtxt", default_name="ident")


def request(**changes: object) -> InferRequest:
    base = InferRequest(
        id="r1",
        model="ident",
        version="",
        inputs=(
            Tensor.from_numpy("A", np.arange(4, dtype=np.float32).reshape(1, 4)),
            Tensor.from_numpy("B", np.array([[7, 8]], dtype=np.int64)),
        ),
        outputs=("OUT",),
        parameters={"flag": 1},
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def with_input(i: int, tensor: Tensor) -> InferRequest:
    inputs = list(request().inputs)
    inputs[i] = tensor
    return request(inputs=tuple(inputs))


A = request().inputs[0]


def test_same_request_same_key_whatever_its_id_deadline_priority_or_input_order() -> None:
    key = cache_key(request(), "1")
    assert len(key) == DIGEST_BYTES
    assert cache_key(request(id="r2", deadline_ms=5, priority=2, created_ms=9), "1") == key
    assert cache_key(request(inputs=request().inputs[::-1]), "1") == key
    copied = Tensor(A.name, A.datatype, A.shape, bytearray(A.data))  # equal bytes, new buffer
    assert cache_key(with_input(0, copied), "1") == key


@pytest.mark.parametrize(
    ("what", "changed"),
    [
        ("version", (request(), "2")),
        ("model", (request(model="other"), "1")),
        ("input bytes", (with_input(0, replace(A, data=np.full(4, 9, np.float32).tobytes())), "1")),
        ("input shape", (with_input(0, replace(A, shape=(2, 2))), "1")),
        ("input dtype", (with_input(0, replace(A, datatype="INT32")), "1")),
        ("input name", (with_input(0, replace(A, name="C")), "1")),
        ("an input less", (request(inputs=request().inputs[:1]), "1")),
        ("outputs", (request(outputs=()), "1")),
        ("outputs order", (request(outputs=("OUT", "X")), "1")),
        ("parameter value", (request(parameters={"flag": 2}), "1")),
        ("parameter type", (request(parameters={"flag": True}), "1")),
        ("parameter added", (request(parameters={"flag": 1, "x": "y"}), "1")),
        ("no parameters", (request(parameters={}), "1")),
        ("classified", (request(classification={"OUT": 3}), "1")),
    ],
)
def test_any_change_that_can_change_the_answer_changes_the_key(
    what: str, changed: tuple[InferRequest, str]
) -> None:
    assert cache_key(*changed) != cache_key(request(), "1"), what


def test_classification_counts_are_part_of_the_key() -> None:
    three, five = request(classification={"OUT": 3}), request(classification={"OUT": 5})
    assert cache_key(three, "1") != cache_key(five, "1")


def test_field_boundaries_do_not_alias() -> None:
    """Length-prefixed fields: moving bytes from one field to the next is another key."""
    assert cache_key(request(model="ab"), "1") != cache_key(request(model="a"), "b1")


def test_slots_stay_within_max_entries() -> None:
    digests = [cache_key(request(parameters={"i": i}), "1") for i in range(500)]
    slots = {slot_of(d, 16) for d in digests}
    assert slots == set(range(16))  # every slot used, none outside
    assert {slot_of(d, 1) for d in digests} == {0}
    key = Names(key_prefix="t:").response_cache_key("ident", 3)
    assert key == "t:cache:ident:3"


def test_entry_keeps_the_answer_and_takes_the_callers_id() -> None:
    out = Tensor.from_numpy("OUT", np.arange(4, dtype=np.float32))
    first = InferResult("r1", "ident", "1", (out,), timing_us={"queue": 5}, worker="w")
    digest = cache_key(request(), "1")
    entry = encode_entry(digest, first)
    hit = decode_entry(entry, digest, "r2")
    assert hit == InferResult("r2", "ident", "1", (replace(out, data=bytes(out.data)),))
    other = cache_key(request(parameters={}), "1")
    assert decode_entry(entry, other, "r2") is None  # the slot holds another request's answer
    assert decode_entry(digest + b"\xc1junk", digest, "r2") is None


def test_a_hit_answers_the_models_response_parameters_too() -> None:
    """The same request gets the same answer, hit or miss: the model's response
    parameters are part of it."""
    out = Tensor.from_numpy("OUT", np.arange(2, dtype=np.int32))
    params = {"n": 5, "t": "x", "f": True, "r": 0.5}
    first = InferResult("r1", "ident", "1", (out,), parameters=params)
    digest = cache_key(request(), "1")
    hit = decode_entry(encode_entry(digest, first), digest, "r2")
    assert hit is not None and hit.parameters == params


def test_default_version_follows_the_policy_and_rereads_after_a_second(tmp_path: Path) -> None:
    (tmp_path / "ident" / "1").mkdir(parents=True)
    (tmp_path / "ident" / "config.pbtxt").write_text(CONFIG)
    now = [0.0]
    versions = DefaultVersions(tmp_path, clock=lambda: now[0])
    assert versions(spec()) == "1"
    (tmp_path / "ident" / "3").mkdir()
    assert versions(spec()) == "1"  # read a moment ago
    now[0] = 1.0
    assert versions(spec()) == "3"
    pinned = spec(
        "version_policy { specific { versions: [ 1 ] } }\nresponse_cache { enable: true }"
    )
    assert versions(pinned) == "1"
    unknown = dataclasses.replace(spec(), name="absent")
    assert versions(unknown) is None  # not cached: version unknown


def test_config_enables_the_cache_and_refuses_bad_values() -> None:
    assert spec().response_cache is True
    assert spec("").response_cache is False
    assert spec("response_cache { enable: false }").response_cache is False
    with pytest.raises(ConfigError, match=r"ident/config\.pbtxt.*true.*false"):
        spec("response_cache { enable: maybe }")
    with pytest.raises(ConfigError, match='no field named "size"'):
        spec("response_cache { size: 10 }")
    decoupled = CONFIG.replace('platform: "onnxruntime_onnx"', 'backend: "python"')
    with pytest.raises(ConfigError, match=r"response_cache\.enable.*decoupled") as err:
        parse_model_config(
            decoupled
            + "response_cache { enable: true }\nmodel_transaction_policy { decoupled: true }",
            source="ident/config.pbtxt",
            default_name="ident",
        )
    assert err.value.details["field"] == "response_cache.enable"


def test_statistics_count_hits_as_successes_and_are_handed_over_once() -> None:
    stats = CacheStatistics(clock=lambda: 1718000000.5)
    stats.hit("ident", "1", 0.000002)
    stats.miss("ident", "1", 0.000005)
    stats.miss("ident", "1", 0.000001)
    assert stats.take() == {
        ("ident", "1"): {
            "cache_hit.count": 1,
            "cache_hit.ns": 2000,
            "success.count": 1,
            "success.ns": 2000,
            "cache_miss.count": 2,
            "cache_miss.ns": 6000,
            "last_inference": 1718000000500,  # the hit answered then
        }
    }
    assert stats.take() == {}
    for i in range(STATS_PENDING_MAX + 5):
        stats.miss("ident", str(i), 0.0)
    assert len(stats.take()) == STATS_PENDING_MAX  # bounded between two flushes


def test_a_hits_time_is_folded_as_the_newest_last_inference() -> None:
    """Two flushes' hits: ``last_inference`` is the newer hit's time, not a sum, and the
    flush carries it to the statistics hash (the script keeps the maximum there)."""
    now = [100.0]
    stats = CacheStatistics(clock=lambda: now[0])
    flushes = CacheFlushes(Names(key_prefix="t:"), ttl_s=60)
    stats.hit("ident", "1", 0.0)
    now[0] = 250.0
    stats.hit("ident", "1", 0.0)
    flushes.fold(stats.take())
    now[0] = 200.0  # a clock stepped back: the hash keeps the newest
    stats.hit("ident", "1", 0.0)
    flushes.fold(stats.take())
    key = Names(key_prefix="t:").model_stats_key("ident", "1")
    fields = flushes.totals["ident"][key]
    assert fields["last_inference"] == 250_000 and fields["success.count"] == 3

    class Pipe:
        args: tuple[object, ...] = ()

        def eval(self, *args: object) -> None:
            self.args = args

    pipe = Pipe()
    flushes.queue(pipe)
    assert 250_000 in pipe.args  # the part's last inference, sent with the increments


class FrozenRedis:
    """A Redis that takes every command and never answers (a frozen server)."""

    async def get(self, key: str) -> bytes:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    async def set(self, key: str, value: bytes, ex: int) -> bool:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_lookups_and_stores_end_with_the_calls_time_when_redis_does_not_answer() -> None:
    """The lookup is DeadlineExceeded (nothing published yet: no job); the store, whose
    answer is already there, is dropped and the miss still counted."""
    cache = ResponseCache(
        FrozenRedis(),  # type: ignore[arg-type]
        ResponseCacheSettings(),
        Names(key_prefix="t:"),
        lambda _: "1",
    )
    with pytest.raises(DeadlineExceeded, match="response cache lookup") as info:
        await asyncio.wait_for(cache.probe(request(), spec(), timeout_s=0.01), 30)  # 30: a guard
    assert "job_id" not in info.value.details
    probe = CacheProbe(request(), "1", cache_key(request(), "1"), 0.0)
    out = Tensor.from_numpy("OUT", np.ones((1, 4), np.float32))
    await asyncio.wait_for(cache.store(probe, InferResult("r1", "ident", "1", (out,)), 0.01), 30)
    assert cache.misses == 1
