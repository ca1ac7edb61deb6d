"""Every sample model answers the same over gRPC as over HTTP (tritonclient's aio clients,
one gateway serving both fronts, one in-process worker per model, and an ensemble runner
per ensemble: text_embed and numeric_dag, whose steps are sample models too). A BYTES
input (text_embed's TEXT) gets sentences, not loadgen's synthetic numbers. A decoupled
model (words) is refused by both one-answer calls (tests/integration/test_decoupled_worker.py
streams it)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http.aio as http_aio
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from plaza.loadgen.inputs import make_inputs, sentences
from plaza.modelconfig import ModelSpec
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings
from plaza.workers.ensemble import EnsembleRunner
from tests.support import (
    REPOSITORY,
    gateway_fronts,
    make_settings,
    phase,
    running_worker,
    with_model,
)

pytestmark = pytest.mark.timeout(300)
START_LIMIT_S = 60.0
"""One model's worker (model load included), ensemble runner, or the gateway gets this long
to start."""
CALL_LIMIT_S = 40.0
"""One call, either front (the gateway's sync timeout is 30 s)."""
STOP_LIMIT_S = 90.0
"""Everything's stop together."""


def inputs(module: Any, feeds: dict[str, np.ndarray[Any, Any]]) -> list[Any]:
    out = []
    for name, array in feeds.items():
        item = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        item.set_data_from_numpy(array)
        out.append(item)
    return out


def feeds_for(spec: ModelSpec, rng: np.random.Generator) -> dict[str, np.ndarray[Any, Any]]:
    """Two rows of inputs for ``spec`` (one for a stateful model: a sequence's request is
    one row); sentences for each BYTES input."""
    feeds = make_inputs(spec, 1 if spec.sequence.enabled else 2, 8, rng)
    for tensor in spec.inputs:
        if tensor.datatype == "BYTES":
            texts = [[s.encode()] for s in sentences(2, seed=len(tensor.name))]
            feeds[tensor.name] = np.array(texts, dtype=np.object_)
    return feeds


@contextlib.asynccontextmanager
async def running_runner(settings: PlazaSettings, ensemble: str) -> AsyncIterator[None]:
    runner = EnsembleRunner(with_model(settings, ensemble))
    await runner.start()
    try:
        yield
    finally:
        await runner.stop()


async def test_every_sample_model_answers_the_same_on_both_fronts(
    kafka_bootstrap: str, redis_url: str, unique_id: str, redis_client: Any
) -> None:
    repo = ModelRepository(REPOSITORY)
    names = repo.model_names()
    assert len(names) >= 6, names
    settings = make_settings(kafka_bootstrap, redis_url, unique_id, gateway={"metrics_port": -1})
    rng = np.random.default_rng(7)
    feeds = {name: feeds_for(repo.spec(name), rng) for name in names}
    stack = contextlib.AsyncExitStack()
    try:
        for name in names:
            spec = repo.spec(name)
            serve = running_runner if spec.is_ensemble else running_worker
            async with phase(f"{name}'s worker or runner start", START_LIMIT_S):
                await stack.enter_async_context(serve(settings, name))
        async with phase("the gateway's start", START_LIMIT_S):
            gw = await stack.enter_async_context(gateway_fronts(settings))
        http = http_aio.InferenceServerClient(gw.http_url.removeprefix("http://"))
        rpc = grpc_aio.InferenceServerClient(gw.grpc_address)
        stack.push_async_callback(http.close)
        stack.push_async_callback(rpc.close)
        for i, name in enumerate(names):
            if repo.spec(name).decoupled:  # many answers: both one-answer calls refuse it
                for client, module in ((http, http_aio), (rpc, grpc_aio)):
                    async with phase(f"{name}'s refusal", CALL_LIMIT_S):
                        with pytest.raises(InferenceServerException, match="decoupled"):
                            await client.infer(name, inputs(module, feeds[name]))
                continue
            # a stateful model's call is a sequence of one request (START and END)
            one: dict[str, Any] = {}
            if repo.spec(name).sequence.enabled:
                one = {"sequence_id": i + 1, "sequence_start": True, "sequence_end": True}
            async with phase(f"{name} over HTTP", CALL_LIMIT_S):
                by_http = await http.infer(name, inputs(http_aio, feeds[name]), **one)
            async with phase(f"{name} over gRPC", CALL_LIMIT_S):
                by_grpc = await rpc.infer(name, inputs(grpc_aio, feeds[name]), **one)
            outputs = [o["name"] for o in by_http.get_response()["outputs"]]
            assert outputs, name
            for output in outputs:
                a, b = by_http.as_numpy(output), by_grpc.as_numpy(output)
                assert a.shape == b.shape and a.dtype == b.dtype, (name, output)
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)
    finally:
        async with phase("the stop of the gateway, runners and workers", STOP_LIMIT_S):
            await stack.aclose()
