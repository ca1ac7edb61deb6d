"""Ensemble semantics as Triton's ensemble scheduler has them, on the real Kafka and Redis.

- An optional ensemble input the request leaves out: the step that reads it runs without
  it (``ensemble_scheduler.cc`` puts a placeholder tensor for it, and ``InitStep`` leaves
  the input out of the step's request; the step model must take it as optional).
- Pruning: only the steps that the requested outputs need run ("Prune ensemble first if
  not all outputs are requested"), in a plain and in a decoupled ensemble.
- Priority: every step's request carries the request's own priority
  (``irequest->SetPriority(priority_)``), settled against the step model's own levels.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, aclosing, asynccontextmanager
from pathlib import Path

import numpy as np
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer

from plaza.client import PlazaClient
from plaza.codec import decode_request
from plaza.connections import ensure_topics
from plaza.contract import InferRequest
from plaza.naming import step_request_id
from plaza.settings import PlazaSettings
from plaza.workers.ensemble import EnsembleRunner
from tests.ensemble_configs import FOUR
from tests.python_models import REPEAT_CONFIG, REPEAT_MODEL, write_model
from tests.support import REPOSITORY, phase, running_worker, with_model

BOUND_S = 60.0
"""Each test's bound on one awaited thing."""

OPT_STEP = """
name: "opt"
backend: "python"
max_batch_size: 8
input [
  { name: "X" data_type: TYPE_FP32 dims: [ 2 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ 2 ] optional: true }
]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""
OPT_MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Y = X + B, or X where B is left out (B is optional)."""

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B")
            y = x if b is None else x + b.as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", y)]))
        return responses
'''
OPT_ENSEMBLE = """
name: "plus"
platform: "ensemble"
max_batch_size: 8
input [
  { name: "X" data_type: TYPE_FP32 dims: [ 2 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ 2 ] optional: true }
]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 2 ] } ]
ensemble_scheduling { step [ { model_name: "opt" model_version: -1
  input_map { key: "X" value: "X" } input_map { key: "B" value: "B" }
  output_map { key: "Y" value: "Y" } } ] }
"""
STRICT_ENSEMBLE = """
name: "strict_plus"
platform: "ensemble"
max_batch_size: 8
input [
  { name: "X" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "B" data_type: TYPE_FP32 dims: [ -1 ] optional: true }
]
output [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "C" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "identity" model_version: -1
    input_map { key: "INPUT0" value: "X" } output_map { key: "OUTPUT0" value: "A" } },
  { model_name: "identity" model_version: -1
    input_map { key: "INPUT0" value: "B" } output_map { key: "OUTPUT0" value: "C" } }
] }
"""
TWO = """
name: "two"
platform: "ensemble"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "identity" model_version: -1
    input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "A" } },
  { model_name: "four" model_version: -1
    input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "B" } }
] }
"""
COPY_I32 = """
name: "copy"
backend: "plaza_simulated"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
"""
PART = """
name: "part"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "COPIED" data_type: TYPE_INT32 dims: [ -1 ] },
         { name: "TOKEN" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
ensemble_scheduling { step [
  { model_name: "copy" model_version: -1
    input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "COPIED" } },
  { model_name: "repeat" model_version: -1
    input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "TOKEN" } }
] }
"""
RANKED = """
name: "ranked"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { priority_levels: 2 default_priority_level: 2 }
"""
RANKED_CHAIN = """
name: "ranked_chain"
platform: "ensemble"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [ { model_name: "ranked" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "OUTPUT0" } } ] }
"""
ENSEMBLES = {
    "plus": OPT_ENSEMBLE,
    "strict_plus": STRICT_ENSEMBLE,
    "two": TWO,
    "part": PART,
    "ranked_chain": RANKED_CHAIN,
}


def repository(root: Path) -> Path:
    """identity (and ``ranked``, identity under priority levels), the step models above,
    and the ensembles (each with an empty version folder)."""
    shutil.copytree(REPOSITORY / "identity", root / "identity")
    shutil.copytree(REPOSITORY / "identity" / "1", root / "ranked" / "1")
    (root / "ranked" / "config.pbtxt").write_text(RANKED)
    write_model(root, "opt", OPT_STEP, OPT_MODEL)
    write_model(root, "repeat", REPEAT_CONFIG, REPEAT_MODEL)
    for name, config in {"four": FOUR, "copy": COPY_I32, **ENSEMBLES}.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
    return root


@asynccontextmanager
async def serving(
    settings: PlazaSettings, workers: list[str], ensembles: list[str]
) -> AsyncIterator[PlazaClient]:
    """Workers of ``workers``, runners of ``ensembles``, and a client."""
    async with AsyncExitStack() as stack:
        for model in workers:
            await stack.enter_async_context(running_worker(settings, model))
        for ensemble in ensembles:
            runner = EnsembleRunner(with_model(settings, ensemble))
            await runner.start()
            stack.push_async_callback(runner.stop)
        yield await stack.enter_async_context(PlazaClient(settings))


def on_repository(settings: PlazaSettings, tmp_path: Path) -> PlazaSettings:
    return settings.model_copy(update={"repository": repository(tmp_path / "repository")})


async def test_an_optional_ensemble_input_left_out_runs_its_step_without_it(
    settings: PlazaSettings, tmp_path: Path, redis_client: aioredis.Redis
) -> None:
    settings = on_repository(settings, tmp_path)
    x = np.array([[1.0, 2.0]], np.float32)
    async with serving(settings, ["opt", "identity"], ["plus", "strict_plus"]) as client:
        given = await client.infer("plus", {"X": x, "B": 10 * x}, timeout_s=BOUND_S)
        np.testing.assert_array_equal(given.output("Y").to_numpy(), 11 * x)
        left_out = await client.infer(
            "plus", {"X": x}, timeout_s=BOUND_S, correlation_id="plus-no-b"
        )
        np.testing.assert_array_equal(left_out.output("Y").to_numpy(), x)
        # The step ran, and its request left B out (not an empty B).
        raw = await redis_client.get(settings.names.result_key(step_request_id("plus-no-b", 0)))
        assert raw is not None
        # A step model whose input is required refuses the step that leaves it out, as
        # Triton's does: the error names the step.
        refused = await client.infer(
            "strict_plus", {"X": x}, timeout_s=BOUND_S, raise_on_error=False
        )
    assert refused.error is not None
    assert refused.error.code == "invalid_input"
    assert refused.error.message.startswith("step 1 (model 'identity'): ")
    assert "INPUT0" in refused.error.message


async def test_only_the_steps_the_requested_outputs_need_run(
    settings: PlazaSettings, tmp_path: Path, redis_client: aioredis.Redis
) -> None:
    settings = on_repository(settings, tmp_path)
    three = np.array([[1.0, 2.0, 3.0]], np.float32)  # fine for A's step, not for B's
    four = np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)
    async with serving(settings, ["identity", "four"], ["two"]) as client:
        only_a = await client.infer(
            "two", {"INPUT0": three}, outputs=["A"], correlation_id="two-a", timeout_s=BOUND_S
        )
        only_b = await client.infer(
            "two", {"INPUT0": four}, outputs=["B"], correlation_id="two-b", timeout_s=BOUND_S
        )
        both = await client.infer("two", {"INPUT0": three}, timeout_s=BOUND_S, raise_on_error=False)
    assert [t.name for t in only_a.outputs] == ["A"]
    np.testing.assert_array_equal(only_a.output("A").to_numpy(), three)
    assert [t.name for t in only_b.outputs] == ["B"]
    assert await _step_answered(redis_client, settings, "two-a", 0)
    assert not await _step_answered(redis_client, settings, "two-a", 1)  # pruned
    assert not await _step_answered(redis_client, settings, "two-b", 0)  # pruned
    # Asking for every output runs every step: the one that cannot take 3 values fails it.
    assert both.error is not None and both.error.message.startswith("step 1 (model 'four'): ")


async def test_a_decoupled_step_no_requested_output_needs_is_pruned(
    settings: PlazaSettings, tmp_path: Path, redis_client: aioredis.Redis
) -> None:
    settings = on_repository(settings, tmp_path)
    numbers = np.array([[5, 6, 7]], np.int32)
    async with serving(settings, ["copy", "repeat"], ["part"]) as client:
        async with phase("the pruned ensemble's responses", BOUND_S):
            stream = client.infer_stream(
                "part", {"IN": numbers}, outputs=["COPIED"], correlation_id="part-1"
            )
            async with aclosing(stream) as responses:
                results = [r async for r in responses]
        async with phase("every response of the whole ensemble", BOUND_S):
            stream = client.infer_stream("part", {"IN": numbers}, outputs=["TOKEN"])
            async with aclosing(stream) as responses:
                tokens = [r.output("TOKEN").to_numpy().item() async for r in responses]
    assert len(results) == 1 and results[0].final  # one answer: repeat did not stream
    np.testing.assert_array_equal(results[0].output("COPIED").to_numpy(), numbers)
    assert not await _step_answered(redis_client, settings, "part-1", 1)
    assert tokens == [5, 6, 7]


async def test_steps_get_the_request_priority_settled_against_their_own_levels(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    """``ranked`` has two levels (default 2); ``ranked_chain`` has none. Priority 1 must
    reach the step as 1 (its level-1 topic), not the ensemble's level 0 (so 2, the default)."""
    settings = on_repository(settings, tmp_path)
    names = settings.names
    step_topics = [names.request_topic("ranked", level) for level in (1, 2)]
    await ensure_topics(settings.kafka, step_topics)
    x = np.array([[1.0, 2.0]], np.float32)
    async with serving(settings, [], ["ranked_chain"]) as client:  # no worker of ranked yet
        jobs = {
            p: await client.submit("ranked_chain", {"INPUT0": x}, priority=p) for p in (1, 2, 0)
        }
        steps = await _step_requests(settings, step_topics, len(jobs))
        async with running_worker(settings, "ranked"):
            for job in jobs.values():
                answer = await client.result(job, timeout_s=BOUND_S)
                np.testing.assert_array_equal(answer.output("OUTPUT0").to_numpy(), x)
    by_ensemble = {rid.rsplit(".", 1)[0]: found for rid, found in steps.items()}
    for priority, level in ((1, 1), (2, 2), (0, 2)):  # 0: the step model's default
        topic, req = by_ensemble[jobs[priority]]
        assert topic == names.request_topic("ranked", level), priority
        assert req.priority == level, priority


async def _step_requests(
    settings: PlazaSettings, topics: list[str], count: int
) -> dict[str, tuple[str, InferRequest]]:
    """The first ``count`` step requests published to ``topics``, by step id: the topic
    each was published to, and the request."""
    consumer = AIOKafkaConsumer(
        *topics,
        bootstrap_servers=settings.kafka.bootstrap_servers,
        group_id=f"{settings.kafka.topic_prefix}test-steps",
        auto_offset_reset="earliest",
    )
    found: dict[str, tuple[str, InferRequest]] = {}
    await consumer.start()
    try:
        async with phase("the step requests", BOUND_S):
            while len(found) < count:
                fetched = await consumer.getmany(timeout_ms=500)
                for tp, records in fetched.items():
                    for record in records:
                        req = decode_request(record.value or b"")
                        found[req.id] = (tp.topic, req)
    finally:
        await consumer.stop()
    return found


async def _step_answered(
    redis_client: aioredis.Redis, settings: PlazaSettings, rid: str, index: int
) -> bool:
    return bool(await redis_client.exists(settings.names.result_key(step_request_id(rid, index))))
