"""Triton's Python backend through real workers on real Kafka and Redis.

The model.py files (tests/python_models.py) are written as Triton's documentation writes
them and live in a repository under tmp_path. add_sub answers through a batching worker; a
BLS model calls add_sub through its Kafka topic; a model whose execute raises, and one that
kills its own process, answer an error and the worker serves the next request; over HTTP
the gateway answers a Python model as it answers any model; a caller that cancels its call
stops a running request of a model that is not decoupled (``is_cancelled()``). A helper
process that model.py forked ends with the model's process: when that process dies, overruns
its limit, is unloaded (SIGKILL for a helper that ignores SIGTERM) or loses its worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis.asyncio as aioredis

from plaza.client import PlazaClient, make_request, new_correlation_id
from plaza.codec import decode_result
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings
from plaza.workers.backends import create_backend, python_backend
from plaza.workers.backends.python_backend import PythonBackend
from plaza.workers.device import CPU
from plaza.workers.worker import Worker
from tests.integration.test_gateway_http import http
from tests.metrics_support import samples, value
from tests.python_models import write_repository
from tests.support import make_settings, running_worker, set_bls_environment, wait_for


@pytest.fixture
def settings(
    kafka_bootstrap: str, redis_url: str, unique_id: str, tmp_path: Path, redis_client: object
) -> PlazaSettings:
    """This test's prefixes, serving the Python test models from tmp_path."""
    root = write_repository(tmp_path / "repository")
    return make_settings(kafka_bootstrap, redis_url, unique_id, repository=root)


@pytest.fixture
def bls_environment(settings: PlazaSettings, monkeypatch: pytest.MonkeyPatch) -> PlazaSettings:
    """The PLAZA_* environment a worker's model process reads for its BLS calls, as
    ``plaza up`` and the stack set it for the workers they start."""
    set_bls_environment(settings, monkeypatch)
    return settings


def _pair(i: int) -> dict[str, np.ndarray]:
    a = np.arange(4, dtype=np.float32).reshape(1, 4) + i
    return {"INPUT0": a, "INPUT1": np.full((1, 4), 0.5, np.float32)}


async def test_add_sub_answers_through_a_batching_worker(settings: PlazaSettings) -> None:
    async with PlazaClient(settings) as client:
        stream = client.results_stream("add-sub")
        inputs = [_pair(i) for i in range(24)]
        ids = await client.publish_many(  # queued before the worker: a deep queue
            make_request("add_sub", x, reply_stream=stream) for x in inputs
        )
        async with running_worker(settings, "add_sub") as worker:
            seen: dict[str, dict[str, np.ndarray]] = {}
            async for _, results in client.consume(stream, "g", "c1", block_ms=500):
                for res in results:
                    assert res.error is None, res.error
                    seen[res.id] = res.as_numpy()
                if len(seen) == len(ids):
                    break
            assert max(worker.metrics.batch_sizes()) > 1  # requests shared execute calls
            assert worker.metrics.executions() < len(ids)
    for rid, x in zip(ids, inputs, strict=True):
        np.testing.assert_array_equal(seen[rid]["OUTPUT0"], x["INPUT0"] + x["INPUT1"])
        np.testing.assert_array_equal(seen[rid]["OUTPUT1"], x["INPUT0"] - x["INPUT1"])


@pytest.fixture
async def add_sub_worker(bls_environment: PlazaSettings) -> AsyncIterator[Worker]:
    async with running_worker(bls_environment, "add_sub") as worker:
        yield worker


async def test_bls_model_calls_another_model_through_its_topic(
    bls_environment: PlazaSettings, add_sub_worker: Worker
) -> None:
    settings = bls_environment
    async with running_worker(settings, "bls"), PlazaClient(settings) as client:
        x = _pair(3)
        name = np.array([[b"add_sub"]], dtype=np.object_)
        result = await client.infer("bls", {**x, "MODEL_NAME": name}, timeout_s=60)
        out = result.as_numpy()
        np.testing.assert_array_equal(out["OUTPUT0"], x["INPUT0"] + x["INPUT1"])
        np.testing.assert_array_equal(out["OUTPUT1"], x["INPUT0"] - x["INPUT1"])
        assert add_sub_worker.metrics.executions() >= 1  # add_sub's own worker ran it
        # The called model's error comes back to the BLS model as the response's error
        # (faulty takes one value per request, not four): the model raises it, as
        # Triton's example does, so the BLS request's answer carries the message.
        async with running_worker(settings, "faulty"):
            other = np.array([[b"faulty"]], dtype=np.object_)
            failed = await client.infer(
                "bls", {**x, "MODEL_NAME": other}, timeout_s=60, raise_on_error=False
            )
        assert failed.error is not None and failed.error.code == "model_error"
        assert "TritonModelException" in failed.error.message
        assert "INPUT" in failed.error.message  # faulty's own words about its inputs


async def test_an_async_bls_model_awaits_two_calls_together(
    bls_environment: PlazaSettings, add_sub_worker: Worker
) -> None:
    """``async def execute`` with ``async_exec``: two BLS calls to add_sub gathered."""
    settings = bls_environment
    async with running_worker(settings, "async_bls"), PlazaClient(settings) as client:
        x = _pair(5)
        name = np.array([[b"add_sub"]], dtype=np.object_)
        result = await client.infer("async_bls", {**x, "MODEL_NAME": name}, timeout_s=60)
    out = result.as_numpy()
    np.testing.assert_array_equal(out["OUTPUT0"], x["INPUT0"] + x["INPUT1"])
    np.testing.assert_array_equal(out["OUTPUT1"], np.zeros((1, 4), np.float32))
    assert add_sub_worker.metrics.executions() >= 1  # both calls went to add_sub's worker


async def test_a_raising_model_answers_an_error_and_the_worker_goes_on(
    settings: PlazaSettings,
) -> None:
    async with running_worker(settings, "faulty"), PlazaClient(settings) as client:
        raised = await client.infer(
            "faulty", {"INPUT0": np.array([-1.0], np.float32)}, raise_on_error=False
        )
        assert raised.error is not None and raised.error.code == "model_error"
        assert "INPUT0 must not be -1" in raised.error.message
        after = await client.infer("faulty", {"INPUT0": np.array([3.0], np.float32)})
        assert after.output("OUTPUT0").to_numpy().tolist() == [3.0]


async def test_a_model_that_kills_its_process_answers_an_error_and_is_restarted(
    settings: PlazaSettings,
) -> None:
    async with running_worker(settings, "faulty") as worker, PlazaClient(settings) as client:
        backend = worker._backends[1]
        assert isinstance(backend, PythonBackend)
        first_pid = backend.pid
        died = await client.infer(
            "faulty", {"INPUT0": np.array([-2.0], np.float32)}, raise_on_error=False
        )
        assert died.error is not None and died.error.code == "model_error"
        assert "exited (status 7)" in died.error.message
        after = await client.infer("faulty", {"INPUT0": np.array([4.0], np.float32)})
        assert after.output("OUTPUT0").to_numpy().tolist() == [4.0]
        assert backend.pid is not None and backend.pid != first_pid


async def test_a_python_model_answers_over_http_like_any_model(settings: PlazaSettings) -> None:
    x = _pair(1)
    body = {
        "id": "py-1",
        "inputs": [
            {"name": n, "datatype": "FP32", "shape": [1, 4], "data": a.reshape(-1).tolist()}
            for n, a in x.items()
        ],
    }
    async with running_worker(settings, "add_sub"), http(settings) as client:
        response = await client.post("/v2/models/add_sub/infer", json=body)
        assert response.status_code == 200, response.text
        doc = response.json()
        assert doc["id"] == "py-1" and doc["model_name"] == "add_sub"
        out = {o["name"]: o["data"] for o in doc["outputs"]}
        assert out["OUTPUT0"] == (x["INPUT0"] + x["INPUT1"]).reshape(-1).tolist()
        assert out["OUTPUT1"] == (x["INPUT0"] - x["INPUT1"]).reshape(-1).tolist()
        metadata = (await client.get("/v2/models/add_sub")).json()
        assert metadata["platform"] == "python"


async def test_a_stateful_python_model_runs_sequences(settings: PlazaSettings) -> None:
    """sequence_batching on a Python model: each request gets the control inputs (START,
    CORRID) and the sequence's implicit state (SUM_IN), and its SUM_OUT is kept for the
    sequence's next request, as for an ONNX model."""
    sums: dict[int, list[int]] = {81: [], 82: []}
    async with running_worker(settings, "running_sum"), PlazaClient(settings) as client:
        for i in range(4):
            for key, step in ((81, 1), (82, 100)):
                params = {"sequence_id": key, "sequence_start": i == 0, "sequence_end": i == 3}
                x = {"X": np.array([[step * (i + 1)]], np.int64)}
                result = await client.infer("running_sum", x, parameters=params)
                assert [t.name for t in result.outputs] == ["TOTAL"]  # the state stays behind
                sums[key].append(int(result.output("TOTAL").to_numpy()[0, 0]))
    assert sums == {81: [1, 3, 6, 10], 82: [100, 300, 600, 1000]}


async def test_a_python_models_own_metrics_are_on_the_workers_metrics(
    settings: PlazaSettings,
) -> None:
    """``pb_utils.MetricFamily``: what model.py counts is on the worker's /metrics, next to
    Plaza's own numbers, after the answers it went with."""
    async with (
        running_worker(settings, "metered", metrics_port=0) as worker,
        PlazaClient(settings) as client,
    ):
        for i in range(3):  # INPUT0 sums: 6, 10, 14
            await client.infer("metered", _pair(i))
        async with httpx.AsyncClient(trust_env=False, timeout=30) as scraper:
            scrape = await scraper.get(f"http://127.0.0.1:{worker.metrics.port}/metrics")
    got = samples(scrape.text)
    assert value(got, "metered_requests", outcome="ok") == 3
    assert value(got, "metered_rows") == 1
    assert value(got, "metered_input_sum_bucket", le="10.0") == 2  # 6 and 10
    assert value(got, "metered_input_sum_count") == 3
    assert value(got, "metered_input_sum_sum") == 30
    assert value(got, "nv_inference_count", model="metered", version="1") == 3


async def test_bls_streams_a_decoupled_models_responses(bls_environment: PlazaSettings) -> None:
    """``exec(decoupled=True)`` and ``await async_exec(decoupled=True)``: the responses of
    repeat (decoupled, its own worker), iterated; the empty final one last."""
    settings = bls_environment
    async with (
        running_worker(settings, "repeat"),
        running_worker(settings, "bls_stream"),
        running_worker(settings, "async_bls_stream"),
        PlazaClient(settings) as client,
    ):
        for model in ("bls_stream", "async_bls_stream"):
            x = {"IN": np.array([[3, 4, 5]], np.int32)}
            out = (await client.infer(model, x, timeout_s=60)).as_numpy()
            assert (out["SUM"][0, 0], out["RESPONSES"][0, 0], out["EMPTY"][0, 0]) == (12, 3, 1)
            # the called model's error response reaches the caller, which raises it
            bad = {"IN": np.array([[1, -1]], np.int32)}
            failed = await client.infer(model, bad, timeout_s=60, raise_on_error=False)
            assert failed.error is not None and "element 1 is -1" in failed.error.message


async def test_a_cancelled_call_stops_a_running_request_of_a_model_that_is_not_decoupled(
    settings: PlazaSettings, redis_client: aioredis.Redis
) -> None:
    """``patient`` (not decoupled) waits in ``execute`` until its request is cancelled: a
    caller that cancels its infer call while the batch runs stores a ``cancelled`` answer,
    the worker's look finds it and the model's ``is_cancelled()`` turns True within moments;
    its batch-mate is answered, and the stored answer stays the caller's."""
    folder = settings.repository / "patient"
    async with running_worker(settings, "patient"), PlazaClient(settings) as client:
        assert any(t.get_name() == "cancels" for t in asyncio.all_tasks())
        rid = new_correlation_id()
        waiting = {"IN": np.array([[-1]], np.int32)}
        call = asyncio.create_task(client.infer("patient", waiting, correlation_id=rid))
        mate = asyncio.create_task(client.infer("patient", {"IN": np.array([[7]], np.int32)}))
        await wait_for((folder / f"waiting-{rid}").exists, 30, "the batch to run")
        assert (folder / f"waiting-{rid}").read_text() == "2"  # one batch of both
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
        took = await wait_for((folder / f"cancelled-{rid}").exists, 10, "the model to see it")
        answered = await mate
        status = await client.poll(rid)
    assert took < 5  # the model waits 20 s for a cancel that does not come
    assert answered.error is None and answered.as_numpy()["OUT"].tolist() == [[7]]
    assert status.result is not None and status.result.error is not None
    assert status.result.error.code == "cancelled"
    assert status.result.error.message != "patient: stopped"  # the caller's, not the model's
    raw = await redis_client.get(settings.names.result_key(rid))
    assert raw is not None and decode_result(raw).error == status.result.error


Helpers = Callable[[str], list[int]]


@pytest.fixture
def helpers(tmp_path: Path) -> Iterator[Helpers]:
    """``helpers(model)``: the pids of the helpers that model's processes forked so far (in
    the repository under tmp_path); at the end every one still running is killed."""
    root = tmp_path / "repository"

    def pids(model: str) -> list[int]:
        listed = root / model / "helpers"
        return [int(pid) for pid in listed.read_text().split()] if listed.exists() else []

    try:
        yield pids
    finally:
        for model in ("forking", "hasty_forking", "stubborn_forking"):
            for pid in pids(model):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _gone(pid: int) -> bool:
    """The process has exited (a zombie that its reaper has not reaped yet counts)."""
    try:
        os.kill(pid, 0)
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (ProcessLookupError, FileNotFoundError):
        return True
    return state == "Z"


async def _helper_ends(pid: int) -> None:
    await wait_for(lambda: _gone(pid), 30, f"the forked helper {pid} to end")


async def test_a_helper_a_python_model_forked_ends_when_its_process_dies(
    settings: PlazaSettings, helpers: Helpers
) -> None:
    """-2 ends the model's process; its helper (SIGTERM) ends too, and so does the next
    process's helper when the worker stops."""
    x = {"INPUT0": np.array([-2.0], np.float32)}
    async with running_worker(settings, "forking"), PlazaClient(settings) as client:
        (first,) = helpers("forking")
        died = await client.infer("forking", x, raise_on_error=False)
        assert died.error is not None and "exited (status 3)" in died.error.message
        await _helper_ends(first)
        after = await client.infer("forking", {"INPUT0": np.array([4.0], np.float32)})
        assert after.output("OUTPUT0").to_numpy().tolist() == [4.0]
        (second,) = helpers("forking")[1:]
        assert not _gone(second)
    await _helper_ends(second)


async def test_a_helper_a_python_model_forked_ends_when_its_process_is_killed(
    settings: PlazaSettings, helpers: Helpers
) -> None:
    """-4 hangs past execute_timeout_s (2 s): the process is killed, its group with it."""
    x = {"INPUT0": np.array([-4.0], np.float32)}
    async with running_worker(settings, "hasty_forking"), PlazaClient(settings) as client:
        (helper,) = helpers("hasty_forking")
        hung = await client.infer("hasty_forking", x, raise_on_error=False)
        assert hung.error is not None and "execute_timeout_s" in hung.error.message
        await _helper_ends(helper)


async def test_a_helper_that_ignores_sigterm_is_killed_once_its_model_is_unloaded(
    settings: PlazaSettings,
    helpers: Helpers,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The helper's grace after SIGTERM is FINALIZE_TIMEOUT_S (10 s): what is proved is the
    # SIGKILL after it (the warning below), not its length.
    monkeypatch.setattr(python_backend, "FINALIZE_TIMEOUT_S", 2.0)
    mv = ModelRepository(settings.repository).served_versions("stubborn_forking")[0]
    backend = create_backend(mv, CPU)
    assert isinstance(backend, PythonBackend)
    backend.load()
    try:
        (helper,) = helpers("stubborn_forking")
        assert not _gone(helper)
    finally:
        backend.unload()  # its SIGTERM ignored: SIGKILL after FINALIZE_TIMEOUT_S
    await _helper_ends(helper)
    assert "a process model.py forked outlived SIGTERM: killing it" in caplog.text


WORKER_SCRIPT = """
import sys
from plaza.repository import ModelRepository
from plaza.workers.backends import create_backend
from plaza.workers.backends import python_backend
from plaza.workers.device import CPU

backend = create_backend(ModelRepository(sys.argv[1]).served_versions("forking")[0], CPU)
backend.load()
open(sys.argv[2], "w").close()
sys.stdin.read()  # until the test kills this process
"""


async def test_a_helper_a_python_model_forked_ends_when_its_worker_dies(
    settings: PlazaSettings, helpers: Helpers
) -> None:
    """A process that loaded the model (as a worker does) is killed: its model's process
    sees its parent go and takes its group with it."""
    loaded = settings.repository / "loaded"
    worker = await asyncio.create_subprocess_exec(
        *(sys.executable, "-c", WORKER_SCRIPT, str(settings.repository), str(loaded)),
        stdin=asyncio.subprocess.PIPE,  # no pipe the model's processes could hold open
        cwd=Path(__file__).parents[2],
    )
    try:
        await wait_for(loaded.exists, 60, "the model to load")
        (helper,) = helpers("forking")
        assert not _gone(helper)
    finally:
        with contextlib.suppress(ProcessLookupError):
            worker.kill()
        await worker.wait()
    await _helper_ends(helper)
