"""A decoupled step with more responses than the runner's reply stream holds for it, on the
real Kafka and Redis.

``spell`` (``pre`` -> ``repeat``, decoupled, one response per element -> ``post``) runs at
most 16 branches of one request at once, so the runner, not the caller, is the slow reader
of ``repeat``'s responses: 1,500 of them come far faster than they are taken, and its reply
stream (1,024 waiting at most) overflows. The runner reads the ones it missed from their
response keys: the ensemble gives every response once, in order, without an error.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import numpy as np

from plaza.client import PlazaClient
from plaza.replies import MAX_PENDING_RESPONSES
from plaza.settings import PlazaSettings
from plaza.workers.ensemble import EnsembleRunner
from tests.python_models import write_repository
from tests.support import make_settings, running_worker, with_model

COUNT = 1500

COPY = """
name: "NAME"
backend: "plaza_simulated"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
"""
SPELL = """
name: "spell"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [
  { name: "TOKEN" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "POS" data_type: TYPE_INT32 dims: [ 1 ] }
]
model_transaction_policy { decoupled: true }
ensemble_scheduling {
  max_inflight_requests: 4
  step [
    {
      model_name: "pre"
      model_version: -1
      input_map { key: "INPUT0" value: "IN" }
      output_map { key: "OUTPUT0" value: "numbers" }
    },
    {
      model_name: "repeat"
      model_version: -1
      input_map { key: "IN" value: "numbers" }
      output_map { key: "OUT" value: "raw_token" }
      output_map { key: "IDX" value: "POS" }
    },
    {
      model_name: "post"
      model_version: -1
      input_map { key: "INPUT0" value: "raw_token" }
      output_map { key: "OUTPUT0" value: "TOKEN" }
    }
  ]
}
"""


def _settings(kafka_bootstrap: str, redis_url: str, unique_id: str, root: Path) -> PlazaSettings:
    write_repository(root, "repeat")
    for name, config in (("pre", COPY), ("post", COPY), ("spell", SPELL)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config.replace("NAME", name))
    return make_settings(kafka_bootstrap, redis_url, unique_id, repository=root)


async def test_a_step_stream_longer_than_the_reply_buffer_reaches_the_caller_whole(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path, redis_client: object
) -> None:
    assert COUNT > MAX_PENDING_RESPONSES + 256  # past the buffer and one stream entry
    settings = _settings(kafka_bootstrap, redis_url, unique_id, tmp_path / "repository")
    async with AsyncExitStack() as stack:
        for model in ("pre", "repeat", "post"):
            await stack.enter_async_context(running_worker(settings, model))
        runner = EnsembleRunner(with_model(settings, "spell"))
        await runner.start()
        stack.push_async_callback(runner.stop)
        client = await stack.enter_async_context(PlazaClient(settings))
        inputs = {"IN": np.arange(COUNT, dtype=np.int32)[None]}
        stream = client.infer_stream("spell", inputs, raise_on_error=False, timeout_s=60)
        got = [r async for r in stream]
    errors = [(r.index, r.error.code, r.error.message) for r in got if r.error is not None]
    assert errors == []
    pairs = [
        (int(r.as_numpy()["TOKEN"].reshape(-1)[0]), int(r.as_numpy()["POS"].reshape(-1)[0]))
        for r in got
    ]
    assert pairs == [(i, i) for i in range(COUNT)]
    assert [r.index for r in got] == list(range(COUNT))
