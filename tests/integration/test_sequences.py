"""Triton's sequence batching through the whole stack: the sample ``accumulate`` (a running
sum kept as the model's implicit state) served by a worker, sequences sent by tritonclient
over HTTP and gRPC with their ``sequence_id``, ``sequence_start`` and ``sequence_end``, the
gateway publishing them to Kafka, answers through Redis. Several sequences at once, each
with its own sum, and the errors a client meets when it gets a sequence wrong."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http.aio as http_aio
from tritonclient.utils import InferenceServerException

from plaza.client import PlazaClient
from plaza.contract import InferRequest, Scalar
from plaza.loadgen.inputs import input_pool
from plaza.loadgen.measure import Load, WindowConfig, measure
from plaza.loadgen.targets import make_target
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings
from plaza.tensors import Tensor
from plaza.workers.runner import WorkItem
from plaza.workers.sequences import SequenceRuns, encode_state
from tests.support import REPOSITORY, gateway_fronts, running_worker

pytestmark = pytest.mark.timeout(180)


def _input(module: object, value: int) -> list[object]:
    item = module.InferInput("INPUT", [1, 1], "INT32")  # type: ignore[attr-defined]
    item.set_data_from_numpy(np.array([[value]], np.int32))
    return [item]


async def test_interleaved_sequences_keep_their_own_sums(settings: PlazaSettings) -> None:
    async with running_worker(settings, "accumulate"), gateway_fronts(settings) as gw:
        http = http_aio.InferenceServerClient(gw.http_url.removeprefix("http://"))
        grpc = grpc_aio.InferenceServerClient(gw.grpc_address)

        async def run(
            client: object, module: object, key: int | str, values: list[int]
        ) -> list[int]:
            sums = []
            for i, value in enumerate(values):
                result = await client.infer(  # type: ignore[attr-defined]
                    "accumulate",
                    _input(module, value),
                    sequence_id=key,
                    sequence_start=i == 0,
                    sequence_end=i == len(values) - 1,
                )
                sums.append(int(result.as_numpy("OUTPUT")[0, 0]))
            return sums

        try:
            got = await asyncio.gather(
                run(http, http_aio, 11, [1, 2, 3, 4, 5]),
                run(http, http_aio, "user-7", [10, 20, 30]),
                run(grpc, grpc_aio, 12, [100, -1, -2, -3]),
                run(grpc, grpc_aio, 13, [5] * 6),
            )
            # the same id again after its END: a new sequence, from zero
            again = await run(http, http_aio, 11, [7, 7])
            assert "sequence" in (await http.get_server_metadata())["extensions"]
        finally:
            await http.close()
            await grpc.close()
    assert got == [[1, 3, 6, 10, 15], [10, 30, 60], [100, 99, 97, 94], [5, 10, 15, 20, 25, 30]]
    assert again == [7, 14]


async def test_sequence_mistakes_are_clear_errors(settings: PlazaSettings) -> None:
    async with running_worker(settings, "accumulate"), gateway_fronts(settings) as gw:
        http = http_aio.InferenceServerClient(gw.http_url.removeprefix("http://"))
        try:
            with pytest.raises(InferenceServerException, match="needs a sequence_id"):
                await http.infer("accumulate", _input(http_aio, 1))
            with pytest.raises(InferenceServerException, match="has not started"):
                await http.infer("accumulate", _input(http_aio, 1), sequence_id=99)
            first = await http.infer(
                "accumulate", _input(http_aio, 4), sequence_id=21, sequence_start=True
            )
            ended = await http.infer(
                "accumulate", _input(http_aio, 5), sequence_id=21, sequence_end=True
            )
            with pytest.raises(InferenceServerException, match="has not started"):
                await http.infer("accumulate", _input(http_aio, 6), sequence_id=21)
            two_rows = http_aio.InferInput("INPUT", [2, 1], "INT32")
            two_rows.set_data_from_numpy(np.array([[1], [2]], np.int32))
            with pytest.raises(InferenceServerException, match="one at most"):
                await http.infer("accumulate", [two_rows], sequence_id=22, sequence_start=True)
        finally:
            await http.close()
    assert int(first.as_numpy("OUTPUT")[0, 0]) == 4
    assert int(ended.as_numpy("OUTPUT")[0, 0]) == 9


async def test_a_start_that_never_runs_leaves_its_sequence_not_started(
    settings: PlazaSettings,
) -> None:
    """A START whose deadline (Triton's ``timeout`` parameter, 1 us) passes in the worker's
    queue never runs: the request after it is refused as not started, not run on the sum
    of the sequence before it (the same id, which its client left without an END) nor from
    zeros (a new id)."""
    async with running_worker(settings, "accumulate"), gateway_fronts(settings) as gw:
        http = http_aio.InferenceServerClient(gw.http_url.removeprefix("http://"))
        try:
            await http.infer("accumulate", _input(http_aio, 5), sequence_id=50, sequence_start=True)
            before = await http.infer("accumulate", _input(http_aio, 6), sequence_id=50)
            for key in (50, 51):
                with pytest.raises(InferenceServerException):  # answered with a timeout
                    await http.infer(
                        "accumulate",
                        _input(http_aio, 100),
                        sequence_id=key,
                        sequence_start=True,
                        timeout=1,
                    )
                with pytest.raises(InferenceServerException, match="has not started"):
                    await http.infer("accumulate", _input(http_aio, 1), sequence_id=key)
            again = await http.infer(
                "accumulate", _input(http_aio, 2), sequence_id=50, sequence_start=True
            )
        finally:
            await http.close()
    assert int(before.as_numpy("OUTPUT")[0, 0]) == 11
    assert int(again.as_numpy("OUTPUT")[0, 0]) == 2  # a START that runs begins it anew


async def test_a_start_that_expires_drops_the_state_of_the_sequence_before(
    settings: PlazaSettings,
) -> None:
    """A START answered with a timeout, unrun, drops its sequence's key, as an END does: the
    key held the sum of the sequence before it (the same id, left without an END), which a
    worker taking the partition over within the idle time would resume."""
    async with running_worker(settings, "accumulate") as worker, PlazaClient(settings) as client:
        key = worker.names.sequence_state_key("accumulate", 1, 80)
        for value, start in ((5, True), (6, False)):
            params = {"sequence_id": 80, "sequence_start": start}
            await client.infer(
                "accumulate", {"INPUT": np.array([[value]], np.int32)}, parameters=params
            )
        held = await worker.redis.exists(key)  # the sum, 11, for a next owner
        params = {"sequence_id": 80, "sequence_start": True}
        x = {"INPUT": np.array([[100]], np.int32)}
        job = await client.submit("accumulate", x, parameters=params, timeout_s=1e-6)
        answer = await client.result(job, raise_on_error=False)
        after = await worker.redis.exists(key)  # gone in the script call of the answer
    assert held == 1
    assert answer.error is not None and answer.error.code == "timeout"
    assert after == 0


async def test_a_start_found_cancelled_drops_only_a_state_from_before_it(
    settings: PlazaSettings, redis_client: Any
) -> None:
    """STARTs found answered at launch (a caller's ``cancelled`` answer, or a replay):
    their sequences' keys are dropped where the state there was made by a request sent
    before the START (the sequence before it), never where the START or a request after
    it made it (a replay of a START that ran), nor for a request that is not a START."""
    spec = ModelRepository(REPOSITORY).spec("accumulate")
    runs = SequenceRuns(spec, settings.names, keep_s=60)
    sent = time.time()
    old = encode_state({"SUM_IN": np.array([11], np.int32)}, sent - 9, sent - 10)
    own = encode_state({"SUM_IN": np.array([5], np.int32)}, sent + 0.001, sent)
    keys = {k: settings.names.sequence_state_key("accumulate", 1, k) for k in (90, 91, 92)}
    await redis_client.set(keys[90], old)  # cancelled START: the sequence before it
    await redis_client.set(keys[91], own)  # a replayed START that ran: its own state
    await redis_client.set(keys[92], old)  # not a START: the sequence goes on
    sent_us = int(sent * 1e6)
    found = [_item(90, 1, True, sent_us), _item(91, 1, True, sent_us), _item(92, 1, False, sent_us)]
    await runs.drop_before_starts(redis_client, found)
    kept = [await redis_client.get(keys[k]) for k in (90, 91, 92)]
    assert kept == [None, own, old]


def _item(key: int, value: int, start: bool, sent_us: int) -> WorkItem:
    params: dict[str, Scalar] = {"sequence_id": key, "sequence_start": start}
    x = Tensor.from_numpy("INPUT", np.array([[value]], np.int32))
    req = InferRequest(f"{key}-{value}", "accumulate", "", (x,), parameters=params, sent_us=sent_us)
    return WorkItem(req, rows=1, version=1)


async def test_each_sequence_stays_on_one_of_two_workers(settings: PlazaSettings) -> None:
    """Two workers share the model's partitions. The SDK publishes straight to Kafka, and a
    sequence's requests go to the partition of its id: were they spread by request id,
    they would reach both workers, and the one without the sequence would refuse them."""
    keys = [31, 32, 33, "s-34", "s-35", "s-36"]
    steps = 5
    async with (
        running_worker(settings, "accumulate") as first,
        running_worker(settings, "accumulate") as second,
        PlazaClient(settings) as client,
    ):

        async def run(key: int | str) -> list[int]:
            sums = []
            for i in range(steps):
                params = {"sequence_id": key, "sequence_start": i == 0}
                params["sequence_end"] = i == steps - 1
                x = {"INPUT": np.array([[i + 1]], np.int32)}
                result = await client.infer("accumulate", x, parameters=params)
                sums.append(int(result.outputs[0].to_numpy()[0, 0]))
            return sums

        # Both members hold partitions before the sequences start, so both serve some.
        partitions = settings.kafka.partitions
        for _ in range(300):
            held = [len(w.consumer.assignment()) for w in (first, second)]
            if all(held) and sum(held) == partitions:
                break
            await asyncio.sleep(0.1)
        assert all(held) and sum(held) == partitions, held
        got = await asyncio.gather(*(run(k) for k in keys))
    assert got == [[1, 3, 6, 10, 15]] * len(keys)


async def _step(client: PlazaClient, key: int | str, i: int, steps: int) -> tuple[int, str]:
    """Request ``i`` (0-based) of a sequence of ``steps``, adding i + 1: its sum and the
    worker that answered it."""
    params = {"sequence_id": key, "sequence_start": i == 0, "sequence_end": i == steps - 1}
    x = {"INPUT": np.array([[i + 1]], np.int32)}
    result = await client.infer("accumulate", x, parameters=params)
    return int(result.outputs[0].to_numpy()[0, 0]), result.worker


Answers = dict[int | str, list[tuple[int, str]]]
"""Each sequence's answers so far: (sum, worker that answered)."""


async def _steps(client: PlazaClient, answers: Answers, steps: int, now: range) -> None:
    """Steps ``now`` of every sequence in ``answers``, the sequences side by side."""

    async def run(key: int | str) -> None:
        for i in now:
            answers[key].append(await _step(client, key, i, steps))

    await asyncio.gather(*(run(key) for key in answers))


async def test_a_sequence_goes_on_after_its_worker_stops(settings: PlazaSettings) -> None:
    """A worker stops in the middle of its sequences; another starts and takes them up
    where their answers left them: each answer carried its sequence's state to Redis."""
    steps = 5
    answers: Answers = {61: [], 62: [], "s-63": []}
    async with PlazaClient(settings) as client:
        async with running_worker(settings, "accumulate") as first:
            await _steps(client, answers, steps, range(2))
        async with running_worker(settings, "accumulate") as second:
            await _steps(client, answers, steps, range(2, steps))
            state_keys = [second.names.sequence_state_key("accumulate", 1, k) for k in answers]
            kept = await second.redis.exists(*state_keys)
    assert [[total for total, _ in run] for run in answers.values()] == [[1, 3, 6, 10, 15]] * 3
    by = [first.id] * 2 + [second.id] * 3
    assert all([worker for _, worker in run] == by for run in answers.values())
    assert kept == 0  # each END dropped its sequence's state


async def test_sequences_go_on_when_a_second_worker_takes_their_partitions(
    settings: PlazaSettings,
) -> None:
    """A second worker joins the group while sequences run on the first: the rebalance moves
    some of their partitions, and those sequences go on on the newcomer, from the states
    their answers on the first worker left."""
    steps = 6
    answers: Answers = {key: [] for key in (71, 72, 73, 74, "s-75", "s-76", "s-77", "s-78")}
    async with (
        running_worker(settings, "accumulate") as first,
        PlazaClient(settings) as client,
    ):
        await _steps(client, answers, steps, range(2))
        async with running_worker(settings, "accumulate") as second:
            for _ in range(300):  # until the group has given the newcomer its share
                if second.consumer.assignment():
                    break
                await asyncio.sleep(0.1)
            await _steps(client, answers, steps, range(2, steps))
    runs = list(answers.values())
    assert [[total for total, _ in run] for run in runs] == [[1, 3, 6, 10, 15, 21]] * len(runs)
    assert all(worker == first.id for run in runs for _, worker in run[:2])
    moved = [run for run in runs if run[-1][1] == second.id]
    assert moved, "no sequence moved to the second worker: the test would show nothing"


async def test_a_stream_may_send_a_sequence_without_waiting(settings: PlazaSettings) -> None:
    """Triton's streaming sequence client: every request of several sequences sent on one
    gRPC stream at once, interleaved, none waiting for an answer. The gateway keeps each
    sequence's requests in the order the stream gave them."""
    keys, steps = [41, 42, "s-43"], 6

    async def requests() -> AsyncIterator[dict[str, Any]]:
        for i in range(steps):
            for key in keys:
                yield {
                    "model_name": "accumulate",
                    "inputs": _input(grpc_aio, i + 1),
                    "request_id": f"{key}/{i}",
                    "sequence_id": key,
                    "sequence_start": i == 0,
                    "sequence_end": i == steps - 1,
                }

    sums: dict[str, int] = {}
    async with running_worker(settings, "accumulate"), gateway_fronts(settings) as gw:
        grpc = grpc_aio.InferenceServerClient(gw.grpc_address)
        try:
            async for result, error in grpc.stream_infer(requests()):
                assert error is None, error.message()
                sums[result.get_response().id] = int(result.as_numpy("OUTPUT")[0, 0])
                if len(sums) == len(keys) * steps:
                    break
        finally:
            await grpc.close()
    running = [sum(range(1, i + 2)) for i in range(steps)]  # 1, 3, 6, 10, 15, 21
    assert sums == {f"{key}/{i}": running[i] for key in keys for i in range(steps)}


async def test_a_stateful_model_warms_up_as_a_sequence_of_one(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    """``model_warmup`` samples give the model only the client's inputs: the worker adds the
    control and state inputs, as for a one-request sequence, or the model would refuse the
    sample and the worker would not start."""
    (tmp_path / "accumulate").mkdir()
    (tmp_path / "accumulate" / "1").symlink_to(REPOSITORY / "accumulate" / "1")
    config = (REPOSITORY / "accumulate" / "config.pbtxt").read_text()
    warm = 'model_warmup [{ name: "zeros" batch_size: 1 inputs { key: "INPUT" value '
    warm += "{ data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } count: 2 }]\n"
    (tmp_path / "accumulate" / "config.pbtxt").write_text(config + warm)
    settings = settings.model_copy(update={"repository": tmp_path})
    async with running_worker(settings, "accumulate"), PlazaClient(settings) as client:
        params = {"sequence_id": 51, "sequence_start": True}
        x = {"INPUT": np.array([[3]], np.int32)}
        first = await client.infer("accumulate", x, parameters=params)
    assert int(first.outputs[0].to_numpy()[0, 0]) == 3


@pytest.mark.parametrize("kind", ["kafka", "http-json", "http-binary"])
async def test_loadgen_drives_a_stateful_model_with_sequences(
    settings: PlazaSettings, kind: str
) -> None:
    """plaza loadgen's targets on accumulate: each concurrent client runs sequences of five
    requests, one request in flight per sequence, and none is refused (a request sent out of
    its sequence's order, or without its flags, would be)."""
    spec = ModelRepository(REPOSITORY).spec("accumulate")
    pool = input_pool(spec)
    cfg = WindowConfig(window_s=1.0, warmup_s=0.3, stable_count=1, max_windows=1)
    async with running_worker(settings, "accumulate"), gateway_fronts(settings) as gw:
        target = make_target(
            kind, "accumulate", pool, url=gw.http_url, settings=settings, sequence_length=5
        )
        await target.start()
        try:
            point = await measure(target, Load("concurrency", 4), cfg)
        finally:
            await target.stop()
    assert point.completed > 10 and point.errors == 0, point.error_examples


# pytorch_libtorch serves TorchScript, which only torch.jit (deprecated in torch) makes
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning")
async def test_a_torchscript_model_runs_sequences(settings: PlazaSettings, tmp_path: Path) -> None:
    """A stateful TorchScript model: its forward takes the config's inputs, then the control
    inputs in the config's order, then the state inputs; it returns its outputs, then its
    state outputs (workers/backends/torch.py). The same running sum as accumulate's."""
    torch = pytest.importorskip("torch", reason="the PyTorch backend needs the torch extra")

    class Accumulate(torch.nn.Module):
        def forward(
            self, x: torch.Tensor, start: torch.Tensor, ready: torch.Tensor, total: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            total = total * (1 - start) + x * ready
            return total, total

    folder = tmp_path / "acc_torch"
    (folder / "1").mkdir(parents=True)
    torch.jit.script(Accumulate()).save(str(folder / "1" / "model.pt"))
    config = (REPOSITORY / "accumulate" / "config.pbtxt").read_text()
    config = config.replace('name: "accumulate"', 'name: "acc_torch"')
    (folder / "config.pbtxt").write_text(
        config.replace('platform: "onnxruntime_onnx"', 'platform: "pytorch_libtorch"')
    )
    settings = settings.model_copy(update={"repository": tmp_path})
    sums: dict[int, list[int]] = {91: [], 92: []}
    async with running_worker(settings, "acc_torch"), PlazaClient(settings) as client:
        for i in range(3):
            for key, step in ((91, 2), (92, 7)):
                params = {"sequence_id": key, "sequence_start": i == 0, "sequence_end": i == 2}
                x = {"INPUT": np.array([[step]], np.int32)}
                result = await client.infer("acc_torch", x, parameters=params)
                sums[key].append(int(result.outputs[0].to_numpy()[0, 0]))
    assert sums == {91: [2, 4, 6], 92: [7, 14, 21]}


async def test_a_sequence_starts_from_its_initial_state_file(
    settings: PlazaSettings, tmp_path: Path
) -> None:
    """``initial_state { data_file }``: at a START the state is the file's bytes (in the
    model folder's ``initial_state/``), not zeros. accumulate zeroes its state where START is
    1; here START's true value is 0 as well, so the sum goes on from the initial 100."""
    folder = tmp_path / "accumulate"
    shutil.copytree(REPOSITORY / "accumulate", folder)
    state = 'output_name: "SUM_OUT"'
    start = "CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ]"
    config = (folder / "config.pbtxt").read_text()
    assert state in config and start in config
    config = config.replace(state, state + ' initial_state [ { data_file: "hundred" } ]')
    config = config.replace(start, start.replace("[ 0, 1 ]", "[ 0, 0 ]"))
    (folder / "config.pbtxt").write_text(config)
    (folder / "initial_state").mkdir()
    (folder / "initial_state" / "hundred").write_bytes(np.array([100], "<i4").tobytes())
    settings = settings.model_copy(update={"repository": tmp_path})
    sums = []
    async with running_worker(settings, "accumulate"), PlazaClient(settings) as client:
        for i in range(3):
            params = {"sequence_id": 95, "sequence_start": i == 0}
            x = {"INPUT": np.array([[i + 1]], np.int32)}
            result = await client.infer("accumulate", x, parameters=params)
            sums.append(int(result.outputs[0].to_numpy()[0, 0]))
    assert sums == [101, 103, 106]
