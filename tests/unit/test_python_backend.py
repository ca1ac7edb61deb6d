"""The Python backend under the worker's runner: model.py files in their own process, no Kafka.

The models (tests/python_models.py) are written as Triton's documentation writes them; each
runs in a real child process. What reaches the model (one InferenceRequest per Plaza request,
in one execute call), what comes back, and what a model that raises, refuses, hangs or kills
its process does to its batch and to the next one.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from plaza.client import make_request
from plaza.contract import InferResult
from plaza.errors import ConfigError, ModelExecutionError
from plaza.repository import ModelRepository, ModelVersion
from plaza.workers.backends import create_backend
from plaza.workers.backends.base import CancellableBackend
from plaza.workers.backends.onnx import OnnxBackend
from plaza.workers.backends.python_backend import PythonBackend
from plaza.workers.backends.simulated import SimulatedBackend
from plaza.workers.device import CPU
from plaza.workers.runner import BatchRunner, WorkItem
from tests.python_models import (
    ADD_SUB_CONFIG,
    FAULTY_CONFIG,
    FAULTY_MODEL,
    write_model,
    write_repository,
)
from tests.support import wait_for


def _version(root: Path, name: str) -> ModelVersion:
    return ModelRepository(root).served_versions(name)[0]


@pytest.fixture
def backends() -> Iterator[list[PythonBackend]]:
    """Backends to unload after the test (their processes end with it)."""
    made: list[PythonBackend] = []
    yield made
    for backend in made:
        backend.unload()


def _load(mv: ModelVersion, made: list[PythonBackend]) -> PythonBackend:
    backend = create_backend(mv, CPU)
    assert isinstance(backend, PythonBackend)
    made.append(backend)
    backend.load()
    return backend


def _run(mv: ModelVersion, backend: PythonBackend, items: list[WorkItem]) -> list[InferResult]:
    return asyncio.run(BatchRunner(mv.spec, {mv.version: backend}).run(items))


def _item(model: str, inputs: dict[str, Any], **options: Any) -> WorkItem:
    rows = next(iter(inputs.values())).shape[0]
    return WorkItem(request=make_request(model, inputs, **options), rows=rows, version=1)


def test_add_sub_answers_each_request_of_a_batch(
    tmp_path: Path, backends: list[PythonBackend]
) -> None:
    mv = _version(write_repository(tmp_path, "add_sub"), "add_sub")
    backend = _load(mv, backends)
    rng = np.random.default_rng(0)
    pairs = [(rng.standard_normal((n, 4)), rng.standard_normal((n, 4))) for n in (1, 3, 2)]
    items = [
        _item("add_sub", {"INPUT0": a.astype(np.float32), "INPUT1": b.astype(np.float32)})
        for a, b in pairs
    ]
    results = _run(mv, backend, items)
    for (a, b), result in zip(pairs, results, strict=True):
        out = result.as_numpy()
        np.testing.assert_allclose(out["OUTPUT0"], a + b, rtol=1e-6)
        np.testing.assert_allclose(out["OUTPUT1"], a - b, rtol=1e-6)


def test_execute_sees_the_batch_as_its_requests(
    tmp_path: Path, backends: list[PythonBackend]
) -> None:
    mv = _version(write_repository(tmp_path, "meta"), "meta")
    backend = _load(mv, backends)
    x = np.zeros((1, 1), np.int32)
    items = [
        _item("meta", {"INPUT0": x}, parameters={"k": "v"}),
        _item("meta", {"INPUT0": np.zeros((2, 1), np.int32)}, outputs=["BATCH", "OUTPUTS"]),
        _item("meta", {"INPUT0": x}),
    ]
    first, second, third = _run(mv, backend, items)
    assert first.as_numpy()["BATCH"].tolist() == [[3]]  # three requests, one execute call
    assert first.as_numpy()["REQUEST_ID"][0, 0].decode() == items[0].request.id
    assert json.loads(first.as_numpy()["PARAMETERS"][0, 0]) == {"k": "v"}
    every = "REQUEST_ID,PARAMETERS,OUTPUTS,BATCH,ARGS"  # none asked: all, as Triton fills in
    assert first.as_numpy()["OUTPUTS"][0, 0].decode() == every
    assert [t.name for t in second.outputs] == ["BATCH", "OUTPUTS"]  # only those asked for
    assert second.as_numpy()["OUTPUTS"].tolist() == [[b"BATCH,OUTPUTS"]] * 2
    args = json.loads(third.as_numpy()["ARGS"][0, 0])
    assert args["model_name"] == "meta" and args["model_instance_kind"] == "CPU"
    assert json.loads(args["model_config"])["parameters"] == {"greeting": {"string_value": "hello"}}


def _faulty(root: Path, **parameters: str) -> ModelVersion:
    """faulty with batching (max_batch_size 4), and the given config parameters."""
    extra = "".join(
        f'parameters [ {{ key: "{k}" value: {{ string_value: "{v}" }} }} ]\n'
        for k, v in parameters.items()
    )
    config = FAULTY_CONFIG.replace("max_batch_size: 0", "max_batch_size: 4") + extra
    return _version(write_model(root, "faulty", config, FAULTY_MODEL), "faulty")


def _values(*values: float) -> list[WorkItem]:
    return [_item("faulty", {"INPUT0": np.array([[v]], np.float32)}) for v in values]


def _outcome(results: list[InferResult]) -> list[Any]:
    return [
        r.error.code if r.error else float(r.output("OUTPUT0").to_numpy()[0, 0]) for r in results
    ]


def test_a_raising_execute_fails_only_its_culprit(
    tmp_path: Path, backends: list[PythonBackend]
) -> None:
    mv = _faulty(tmp_path)
    backend = _load(mv, backends)
    results = _run(mv, backend, _values(1, -1, 2, 3))
    assert _outcome(results) == [1.0, "model_error", 2.0, 3.0]
    message = results[1].error.message if results[1].error else ""
    assert "INPUT0 must not be -1" in message and "TritonModelException" in message
    refused = _run(mv, backend, _values(-3))
    assert _outcome(refused) == ["invalid_input"]  # a TritonError keeps its meaning
    assert refused[0].error is not None and refused[0].error.message == "INPUT0 -3 is refused"


def test_a_process_that_exits_fails_its_batch_and_is_started_again(
    tmp_path: Path, backends: list[PythonBackend]
) -> None:
    mv = _faulty(tmp_path)
    backend = _load(mv, backends)
    before = backend.pid
    crashed = _run(mv, backend, _values(5, -2, 6))
    assert _outcome(crashed) == ["model_error"] * 3
    assert crashed[0].error is not None and "exited (status 7)" in crashed[0].error.message
    assert _outcome(_run(mv, backend, _values(7, 8))) == [7.0, 8.0]
    assert backend.pid is not None and backend.pid != before


def test_an_execute_past_its_timeout_is_killed(
    tmp_path: Path, backends: list[PythonBackend]
) -> None:
    mv = _faulty(tmp_path, execute_timeout_s="0.5")
    backend = _load(mv, backends)
    hung = _run(mv, backend, _values(-4))
    assert _outcome(hung) == ["model_error"]
    assert hung[0].error is not None and "execute_timeout_s" in hung[0].error.message
    assert _outcome(_run(mv, backend, _values(9))) == [9.0]


def test_unload_ends_the_process(tmp_path: Path) -> None:
    mv = _version(write_repository(tmp_path, "add_sub"), "add_sub")
    backend = PythonBackend(mv, CPU)
    backend.load()
    assert backend.pid is not None
    backend.unload()
    assert backend.pid is None


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("class Other:\n    pass\n", "defines no class TritonPythonModel"),
        (
            "class TritonPythonModel:\n    def initialize(self, args):\n"
            "        raise ValueError('no weights')\n    def execute(self, requests):\n"
            "        return []\n",
            "ValueError: no weights",
        ),
        ("import nothing_of_that_name\n", "ModuleNotFoundError"),
    ],
)
def test_a_model_py_that_cannot_load_is_a_config_error(
    tmp_path: Path, source: str, message: str
) -> None:
    mv = _version(write_model(tmp_path, "faulty", FAULTY_CONFIG, source), "faulty")
    backend = PythonBackend(mv, CPU)
    with pytest.raises(ConfigError, match=message):
        backend.load()
    assert backend.pid is None


ASYNC_MODEL = '''
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """OUTPUT0 = INPUT0 + INPUT1, computed in an async def execute that awaits between
    requests; it counts its calls on the loop it runs on (the same one every time)."""

    def initialize(self, args):
        self.loops = set()

    async def execute(self, requests):
        self.loops.add(id(asyncio.get_running_loop()))
        responses = []
        for request in requests:
            await asyncio.sleep(0)
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            total = pb_utils.Tensor("OUTPUT0", a + b)
            loops = pb_utils.Tensor("OUTPUT1", (a * 0 + len(self.loops)).astype(a.dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[total, loops]))
        return responses
'''


def test_an_async_execute_runs_to_its_end_on_one_loop(
    tmp_path: Path, backends: list[PythonBackend]
) -> None:
    config = ADD_SUB_CONFIG.replace('name: "add_sub"', 'name: "asyncsum"')
    mv = _version(write_model(tmp_path, "asyncsum", config, ASYNC_MODEL), "asyncsum")
    backend = _load(mv, backends)
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    for _ in range(2):  # two batches: the second on the first one's loop
        items = [
            _item("asyncsum", {"INPUT0": a[i : i + 1], "INPUT1": a[i : i + 1]}) for i in (0, 1)
        ]
        results = _run(mv, backend, items)
    for i, result in enumerate(results):
        np.testing.assert_array_equal(result.as_numpy()["OUTPUT0"], 2 * a[i : i + 1])
        assert result.as_numpy()["OUTPUT1"].tolist() == [[1.0] * 4]


def _stream(
    mv: ModelVersion, backend: PythonBackend, items: list[WorkItem]
) -> tuple[list[InferResult], list[InferResult]]:
    """A decoupled batch through the runner: (every response in the order sent, the finals)."""
    sent: list[InferResult] = []
    runner = BatchRunner(mv.spec, {mv.version: backend})
    finals = asyncio.run(runner.run(items, lambda _item, result: sent.append(result)))
    return sent, finals


def _repeat(values: list[int], model: str = "repeat", **parameters: Any) -> WorkItem:
    return _item(model, {"IN": np.array([values], np.int32)}, parameters=parameters)


def _outs(results: list[InferResult]) -> list[tuple[int, int, bool]]:
    return [
        (r.index, int(r.as_numpy()["OUT"][0, 0]), r.final) for r in results if r.outputs
    ]  # fmt: skip


def test_a_decoupled_model_answers_each_request_many_times(
    tmp_path: Path, backends: list[PythonBackend]
) -> None:
    mv = _version(write_repository(tmp_path, "repeat"), "repeat")
    backend = _load(mv, backends)
    items = [_repeat([5, 6, 7]), _repeat([8, 9], last_is_final=True), _repeat([])]
    sent, finals = _stream(mv, backend, items)
    by_id = {it.request.id: [r for r in sent if r.id == it.request.id] for it in items}
    first, second, third = (by_id[it.request.id] for it in items)
    assert _outs(first) == [(0, 5, False), (1, 6, False), (2, 7, False)]
    assert [r.as_numpy()["IDX"][0, 0] for r in first] == [0, 1, 2]
    assert _outs(second) == [(0, 8, False)] and third == []
    # the finals: an empty one after three responses, the last response itself, an empty one
    assert [(f.id, f.index, f.final, f.empty) for f in finals] == [
        (items[0].request.id, 3, True, True),
        (items[1].request.id, 1, True, False),
        (items[2].request.id, 0, True, True),
    ]
    assert _outs([finals[1]]) == [(1, 9, True)] and finals[0].outputs == ()


def test_a_decoupled_models_responses_may_come_after_execute_returned(
    tmp_path: Path, backends: list[PythonBackend]
) -> None:
    root = write_repository(tmp_path, "repeat", "async_repeat")
    for name in ("repeat", "async_repeat"):
        mv = _version(root, name)
        backend = _load(mv, backends)
        items = [_repeat([1, 2], name, later=True), _repeat([3], name, later=True)]
        sent, finals = _stream(mv, backend, items)
        first = [r for r in sent if r.id == items[0].request.id]
        assert [(r.index, int(r.as_numpy()["OUT"][0, 0])) for r in first] == [(0, 1), (1, 2)]
        assert [(f.index, f.empty) for f in finals] == [(2, True), (1, True)], name
        # the process serves the next batch as well (nothing of the last one left over)
        sent, finals = _stream(mv, backend, [_repeat([4], name)])
        assert _outs(sent) == [(0, 4, False)] and finals[0].index == 1


def test_a_decoupled_models_error_response_and_failures_close_the_open_requests(
    tmp_path: Path, backends: list[PythonBackend]
) -> None:
    mv = _version(write_repository(tmp_path, "repeat"), "repeat")
    backend = _load(mv, backends)
    # an error response is one response among the others; the request goes on
    sent, finals = _stream(mv, backend, [_repeat([1, -1, 2])])
    assert [(r.index, r.error.code if r.error else "ok") for r in sent] == [
        (0, "ok"), (1, "invalid_input"), (2, "ok"),
    ]  # fmt: skip
    assert "element 1 is -1" in sent[1].error.message and finals[0].empty  # type: ignore[union-attr]
    # execute raises at the second request: the first is answered and closed; the second
    # keeps its first response and is closed by the error; the third, never answered, too
    items = [_repeat([1]), _repeat([2, -2]), _repeat([3])]
    sent, finals = _stream(mv, backend, items)
    assert [(r.id, r.index) for r in sent] == [(items[0].request.id, 0), (items[1].request.id, 0)]
    assert finals[0].empty and finals[0].index == 1
    for final, index in ((finals[1], 1), (finals[2], 0)):
        assert final.final and final.index == index and final.error is not None
        assert final.error.code == "model_error" and "asked to fail" in final.error.message
    # the process dies mid-stream: the open requests get model_error, the next batch runs
    pid = backend.pid
    sent, finals = _stream(mv, backend, [_repeat([1, -3])])
    assert _outs(sent) == [(0, 1, False)]
    assert finals[0].error is not None and "exited" in finals[0].error.message
    sent, finals = _stream(mv, backend, [_repeat([6])])
    assert _outs(sent) == [(0, 6, False)] and finals[0].empty and backend.pid != pid
    # the one-answer path (the profiler's infer) says why it cannot serve such a model
    with pytest.raises(ModelExecutionError, match="'repeat' is decoupled"):
        backend.infer({"IN": np.array([[1]], np.int32)}, ["OUT"])
    sent, finals = _stream(mv, backend, [_repeat([7])])  # and the process is still in step
    assert _outs(sent) == [(0, 7, False)] and finals[0].empty


def test_infer_runs_a_stacked_batch_as_one_request(
    tmp_path: Path, backends: list[PythonBackend]
) -> None:
    mv = _version(write_repository(tmp_path, "add_sub"), "add_sub")
    backend = _load(mv, backends)
    a = np.ones((4, 4), np.float32)
    out = backend.infer({"INPUT0": a, "INPUT1": a * 2}, ["OUTPUT1"])
    assert list(out) == ["OUTPUT1"]
    np.testing.assert_array_equal(out["OUTPUT1"], -a)


BUSY_MODEL = """
import os
import time


class TritonPythonModel:
    def execute(self, requests):
        open(os.environ["BUSY_MARK"], "w").close()  # in execute now
        time.sleep(3600)
"""

_ORPHAN_SCRIPT = """
import os, sys, threading, time
import numpy as np
from plaza.client import make_request
from plaza.repository import ModelRepository
from plaza.workers.backends.python_backend import PythonBackend
from plaza.workers.device import CPU
backend = PythonBackend(ModelRepository(sys.argv[1]).served_versions("faulty")[0], CPU)
backend.load()
print(backend.pid, flush=True)
request = make_request("faulty", {"INPUT0": np.zeros(1, np.float32)})
threading.Thread(target=backend.execute_requests, args=([request],), daemon=True).start()
while not os.path.exists(os.environ["BUSY_MARK"]):
    time.sleep(0.01)
os._exit(0)  # the worker dies while model code runs: no unload, no finalize
"""


def _gone(pid: int) -> bool:
    """No such process, or only its zombie (a container's init may not reap it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def test_a_busy_model_process_exits_when_its_worker_dies(tmp_path: Path) -> None:
    root = write_model(tmp_path / "repo", "faulty", FAULTY_CONFIG, BUSY_MODEL)
    mark = tmp_path / "busy"
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "BUSY_MARK": str(mark),
    }
    worker = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_SCRIPT, str(root)],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert worker.stdout is not None
    pid = int(worker.stdout.readline())
    assert worker.wait(60) == 0 and mark.exists()
    asyncio.run(wait_for(lambda: _gone(pid), 30, f"model process {pid} to exit"))


def test_a_cancel_reaches_a_decoupled_model_busy_in_execute(
    tmp_path: Path, backends: list[PythonBackend]
) -> None:
    """``cancel`` while the model sends from inside ``execute``: its ``is_cancelled`` turns
    True, it stops and closes the request; ids not running are left alone."""
    root = write_repository(tmp_path, "endless")
    mv = _version(root, "endless")
    backend = _load(mv, backends)
    item = _item("endless", {"IN": np.array([[0]], np.int32)})
    rid = item.request.id
    three = threading.Event()
    sent: list[InferResult] = []

    def sink(_item: WorkItem, result: InferResult) -> None:
        sent.append(result)
        if len(sent) == 3:
            three.set()

    runner = BatchRunner(mv.spec, {mv.version: backend})
    batch = threading.Thread(target=lambda: sent.extend(runner.run_group([item], sink)))
    batch.start()
    assert three.wait(30)
    assert backend.running() == [rid]
    backend.cancel(["someone-else", rid])
    assert backend.running() == []  # told once
    batch.join(30)
    assert not batch.is_alive()
    count = int((root / "endless" / f"cancelled-{rid}").read_text())
    assert 3 <= count < 500 and sent[-1].final and sent[-1].index == count
    backend.cancel([rid])  # after its batch: nothing to tell, and nothing goes wrong
    again = BatchRunner(mv.spec, {mv.version: backend})
    follow = _item("endless", {"IN": np.array([[0]], np.int32)})
    stop_soon = threading.Timer(0.2, lambda: backend.cancel([follow.request.id]))
    stop_soon.start()
    finals = again.run_group([follow], lambda _i, _r: None)
    assert finals[0].final and (root / "endless" / f"cancelled-{follow.request.id}").exists()


def test_a_cancel_reaches_a_model_that_is_not_decoupled_and_spares_its_batch_mates(
    tmp_path: Path, backends: list[PythonBackend]
) -> None:
    """``cancel`` while a batch of ``patient`` (not decoupled) runs: the waiting request's
    ``is_cancelled`` turns True and it answers ``cancelled`` at once; its batch-mate is
    answered; a cancel after the batch tells nothing, and the process serves on."""
    root = write_repository(tmp_path, "patient")
    mv = _version(root, "patient")
    backend = _load(mv, backends)
    waiting, mate = (_item("patient", {"IN": np.array([[v]], np.int32)}) for v in (-1, 7))
    rid = waiting.request.id
    runner = BatchRunner(mv.spec, {mv.version: backend})
    results: list[InferResult] = []
    batch = threading.Thread(target=lambda: results.extend(runner.run_group([waiting, mate])))
    batch.start()
    asyncio.run(wait_for((root / "patient" / f"waiting-{rid}").exists, 30, "the batch to run"))
    assert sorted(backend.running()) == sorted([rid, mate.request.id])
    backend.cancel(["someone-else", rid])
    assert backend.running() == [mate.request.id]  # told once
    batch.join(10)  # the model waits 20 s for a cancel that does not come
    assert not batch.is_alive()
    assert float((root / "patient" / f"cancelled-{rid}").read_text()) < 10
    stopped, answered = results
    assert stopped.error is not None and stopped.error.code == "cancelled"
    assert stopped.error.message == "patient: stopped"
    assert answered.error is None and answered.as_numpy()["OUT"].tolist() == [[7]]
    assert backend.running() == []
    backend.cancel([rid])  # after its batch: nothing to tell, and nothing goes wrong
    again = runner.run_group([_item("patient", {"IN": np.array([[8]], np.int32)})])
    assert again[0].error is None and again[0].as_numpy()["OUT"].tolist() == [[8]]


def test_only_the_python_backend_hears_cancels() -> None:
    """The worker's cancel look runs only for backends that can tell their model."""
    assert issubclass(PythonBackend, CancellableBackend)
    assert not issubclass(OnnxBackend, CancellableBackend)
    assert not issubclass(SimulatedBackend, CancellableBackend)


def test_a_models_response_parameters_reach_its_result_and_bad_ones_fail_it_alone(
    tmp_path: Path, backends: list[PythonBackend]
) -> None:
    """annotated answers with {"a": 1, "b": "x", "c": True}; -1 makes it attach a float,
    which pb_utils refuses: that request's model_error, its batch-mates answered."""
    mv = _version(write_repository(tmp_path, "annotated", "add_sub"), "annotated")
    backend = _load(mv, backends)
    items = [_item("annotated", {"INPUT0": np.array([[v]], np.int32)}) for v in (4, -1, 5)]
    first, bad, last = _run(mv, backend, items)
    for result, value in ((first, 4), (last, 5)):
        assert result.error is None and result.as_numpy()["OUTPUT0"].tolist() == [[value]]
        assert result.parameters == {"a": 1, "b": "x", "c": True}
        assert type(result.parameters["c"]) is bool and type(result.parameters["a"]) is int
    assert bad.error is not None and bad.error.code == "model_error"
    assert "parameter 'bad'" in bad.error.message and "bool/int/str" in bad.error.message
    again = _run(mv, backend, [_item("annotated", {"INPUT0": np.array([[6]], np.int32)})])
    assert again[0].parameters == {"a": 1, "b": "x", "c": True}  # the same process serves on
    plain_mv = _version(tmp_path, "add_sub")
    plain = _run(plain_mv, _load(plain_mv, backends), [_item("add_sub", _pair())])[0]
    assert plain.error is None and plain.parameters == {}


def _pair() -> dict[str, np.ndarray]:
    return {"INPUT0": np.ones((1, 4), np.float32), "INPUT1": np.ones((1, 4), np.float32)}


def test_each_response_of_a_decoupled_model_carries_its_own_parameters(
    tmp_path: Path, backends: list[PythonBackend]
) -> None:
    mv = _version(write_repository(tmp_path, "annotated_stream"), "annotated_stream")
    backend = _load(mv, backends)
    items = [
        _item("annotated_stream", {"IN": np.array([[3, 4]], np.int32)}),
        _item("annotated_stream", {"IN": np.array([[5]], np.int32)}, parameters={
            "last_is_final": True}),
    ]  # fmt: skip
    sent, finals = _stream(mv, backend, items)
    assert [(r.index, dict(r.parameters)) for r in sent if r.id == items[0].request.id] == [
        (0, {"index": 0, "word": "w3", "even": True}),
        (1, {"index": 1, "word": "w4", "even": False}),
    ]
    assert finals[0].empty and finals[0].parameters == {}  # the final flag alone: none
    assert finals[1].final and finals[1].parameters == {"index": 0, "word": "w5", "even": True}


def test_a_response_the_worker_cannot_read_is_its_requests_model_error(tmp_path: Path) -> None:
    """Never an exception out of ``_answer``: in a decoupled batch one would leave the rest
    of the batch's frames unread on the pipe."""
    import msgpack

    mv = _version(write_repository(tmp_path, "add_sub"), "add_sub")
    backend = PythonBackend(mv, CPU)  # not started: reading an answer needs no process
    request = make_request("add_sub", _pair())
    raw = {"v": 1, "id": request.id, "model": "add_sub", "version": "", "status": "ok",
           "outputs": [], "parameters": {"f": [1]}}  # fmt: skip
    answer = backend._answer(request, msgpack.packb(raw, use_bin_type=True))
    assert isinstance(answer, ModelExecutionError) and "parameter 'f'" in answer.message
