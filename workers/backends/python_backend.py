"""Triton's Python backend: ``backend: "python"`` runs ``<version>/model.py`` in its own process.

Each backend (one per served version of the model, in each worker) owns one child process
(``python_stub``) that loads model.py with Plaza's ``triton_python_backend_utils``; frames go
over two pipes (``python_channel``). The worker's runner hands a batch over as its requests
(``execute_requests``), so ``TritonPythonModel.execute`` sees one ``InferenceRequest`` per
Plaza request, as in Triton. Isolation: the call blocks the worker's executor thread, never
its event loop; a model that raises answers its batch with ``model_error``; a child that dies
(``os._exit``, a segfault, out of memory; seen by its exit, not only its pipes' close, which
a process it forked may hold off) answers its batch with ``model_error`` too and is started
again for the next batch; one that overruns ``execute_timeout_s`` (a config
parameter, 0 = no limit) is killed and treated the same. The process leads a process group
(a session) of its own, the worker outside it: whatever the model forked ends with it
(``_stop``: SIGTERM once it has exited, SIGKILL after ``FINALIZE_TIMEOUT_S``; SIGKILL at
once where it is killed). A decoupled model's batch
(``execute_decoupled``) hands each response on as its frame arrives, and the limit covers
the batch until its last request is closed. While any batch runs, ``running`` names its
requests and ``cancel`` tells the model's process of those whose callers went away
(``request.is_cancelled()``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf import json_format
from pydantic import SecretStr

import plaza
from plaza.client import make_request
from plaza.codec import decode_result, encode_request
from plaza.contract import InferRequest
from plaza.errors import ConfigError, ModelExecutionError, PlazaError
from plaza.log_settings import SeverityFilter, log_state
from plaza.modelconfig import ModelSpec, int64_as_numbers
from plaza.repository import ModelVersion
from plaza.settings import PlazaSettings
from plaza.workers.backends.base import Answer, Arrays, Response, Send
from plaza.workers.backends.pb_metrics import Snapshot
from plaza.workers.backends.python_channel import Channel, ChannelClosed, ChannelTimeout
from plaza.workers.backends.python_errors import answer_error
from plaza.workers.custom_metrics import fold
from plaza.workers.device import Device

log = logging.getLogger(__name__)
T = TypeVar("T")
STUB_MODULE = "plaza.workers.backends.python_stub"
LOAD_TIMEOUT_S = 300.0
"""How long ``initialize`` may take (model.py may load weights)."""
FINALIZE_TIMEOUT_S = 10.0
"""How long ``finalize`` may take before the process is killed; and how long what it forked
has after SIGTERM, once it exited, before SIGKILL."""
GROUP_POLL_S = 0.05
"""How often a stop looks whether the process's group still has a process."""


class PythonBackend:
    """A ``model.py`` behind the backend interface, in a process of its own."""

    def __init__(
        self,
        mv: ModelVersion,
        device: Device,
        settings: PlazaSettings | None = None,
        instance: int = 0,
    ):
        self.mv = mv
        self.spec = mv.spec
        self.device = device
        self.instance = instance
        """Which of the model's instances this is, counted across its instance groups in
        order (the worker sets it before ``load``): it names the instance in ``initialize``'s
        args (``instance_name``)."""
        self._settings_json = settings_json(settings) if settings is not None else ""
        self._timeout_s = _execute_timeout(mv)
        self._outputs = [o.name for o in mv.spec.outputs]
        self._process: subprocess.Popen[bytes] | None = None
        self._channel: Channel | None = None
        self._lock = threading.Lock()
        """One exchange at a time: the executor thread's batch, or the stop's finalize."""
        self._cancels = threading.Lock()
        """Guards ``_running``, and the channel while a cancel frame goes out on it."""
        self._running: dict[str, bool] = {}
        """The batch running now: its request ids, True once cancelled."""
        self.custom_metrics: Snapshot = []
        """The model's own metrics (``pb_utils.MetricFamily``), as its process last sent
        them; a new process (after a crash) starts them again from zero."""

    # -- the backend interface -------------------------------------------------------------
    def load(self) -> None:
        """Start the process and run ``initialize``; ConfigError when model.py fails to."""
        with self._lock:
            self._start()

    def execute_requests(self, requests: Sequence[InferRequest]) -> list[Answer]:
        """One answer per request, in order: its output tensors, or its error.

        A process that dies or overruns answers every request of the batch with its error;
        an ``execute`` that raises raises ModelExecutionError, so that the runner splits the
        batch to find the request that fails on its own (as for every backend)."""
        if self.spec.decoupled:  # its process answers in frames of responses
            raise ModelExecutionError(
                f"model {self.spec.name!r} is decoupled: its batches run through "
                "execute_decoupled, which passes on each of its responses"
            )
        try:
            with self._lock:
                if self._channel is None:
                    self._restart()
                message = _execute_message(requests)
                self._exchange(lambda channel: channel.send(message), "execute_timeout_s")
                with self._hearing_cancels(requests):
                    recv = partial(Channel.recv, timeout_s=self._timeout_s)
                    reply = self._exchange(recv, "execute_timeout_s")
                self._took_metrics(reply)
        except PlazaError as exc:
            lost = ModelExecutionError(f"{exc.message}; a new process takes the next batch")
            return [lost] * len(requests)
        if "error" in reply:
            log.info("%s: execute failed:\n%s", self.spec.name, reply.get("traceback", ""))
            raise ModelExecutionError(str(reply["error"]))
        encoded = reply.get("results", [])
        if len(encoded) != len(requests):
            raise ModelExecutionError(
                f"the model process answered {len(encoded)} of {len(requests)} requests"
            )
        return [self._answer(r, raw) for r, raw in zip(requests, encoded, strict=True)]

    def execute_decoupled(self, requests: Sequence[InferRequest], send: Send) -> None:
        """A decoupled model's batch: ``send(i, answer, final)`` for each response of
        request ``i`` as its frame arrives (answer None: the final flag without a
        response), on this thread. Returns once every request got its final flag; raises
        ModelExecutionError when ``execute`` failed or the process died or overran
        ``execute_timeout_s`` (across the whole batch), its open requests unanswered."""
        with self._lock:
            if self._channel is None:
                self._restart()
            message = _execute_message(requests)
            deadline = None if self._timeout_s is None else time.monotonic() + self._timeout_s
            self._exchange(lambda channel: channel.send(message), "execute_timeout_s")
            with self._hearing_cancels(requests):
                frame = self._responses(requests, send, deadline)
        self._took_metrics(frame)
        if "error" in frame:
            log.info("%s: execute failed:\n%s", self.spec.name, frame.get("traceback", ""))
            raise ModelExecutionError(str(frame["error"]))

    def running(self) -> list[str]:
        """The ids of the batch running now that are not cancelled (any thread)."""
        with self._cancels:
            return [rid for rid, cancelled in self._running.items() if not cancelled]

    def cancel(self, ids: Sequence[str]) -> None:
        """Tell the model that these requests' callers went away (``is_cancelled``), if they
        are still running; each once. Any thread; a process gone meanwhile is no error."""
        with self._cancels:
            chosen = [rid for rid in ids if self._running.get(rid) is False]
            channel = self._channel
            if channel is None:
                return
            for part in _frames_of(chosen):
                # A full pipe: the model has not asked for the frames sent (its process
                # reads them then); the rest are told at a later look, never waited for.
                if not channel.writable():
                    return
                for rid in part:
                    self._running[rid] = True
                # A batch that ends meanwhile: its process skips a cancel frame that comes
                # between batches. A process gone: nothing to tell.
                with contextlib.suppress(ChannelClosed):
                    channel.send({"op": "cancel", "ids": part})

    @contextlib.contextmanager
    def _hearing_cancels(self, requests: Sequence[InferRequest]) -> Iterator[None]:
        """While the batch's frame is with the process: ``running`` names its requests.
        Set only once the frame is sent, so a cancel frame never comes before it."""
        with self._cancels:
            self._running = {r.id: False for r in requests}
        try:
            yield
        finally:
            with self._cancels:
                self._running = {}

    def _responses(
        self, requests: Sequence[InferRequest], send: Send, deadline: float | None
    ) -> dict[str, Any]:
        """The batch's response frames handed to ``send``; returns its closing frame.

        Anything that escapes before that frame (a bad frame, a ``send`` that fails even to
        close its request) kills the process: its batch's later frames are never read by
        the next batch as its own."""
        try:
            return self._read_responses(requests, send, deadline)
        except BaseException:
            self._stop(kill=True)
            raise

    def _read_responses(
        self, requests: Sequence[InferRequest], send: Send, deadline: float | None
    ) -> dict[str, Any]:
        failed: set[int] = set()  # closed by a response's error: their later ones dropped
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            frame = self._exchange(partial(Channel.recv, timeout_s=left), "execute_timeout_s")
            if "response" not in frame:
                return frame
            i, raw = int(frame["response"]), frame.get("result")
            if not 0 <= i < len(requests):
                raise ModelExecutionError(f"the model process sent a response for {i}")
            if i in failed:
                continue
            answer = None if raw is None else self._answer(requests[i], raw)
            try:
                send(i, answer, bool(frame.get("final")))
            except Exception as exc:  # this request's alone: its batch-mates go on
                failed.add(i)
                log.warning(
                    "%s: request %s: its response failed: %s", self.spec.name, requests[i].id, exc
                )
                send(i, ModelExecutionError(f"model {self.spec.name!r} failed: {exc}"), True)

    def infer(self, inputs: Arrays, outputs: list[str]) -> Arrays:
        """A whole stacked batch as one request (the profiler's and raw ceiling's path)."""
        answer = self.execute_requests([make_request(self.spec.name, inputs, outputs=outputs)])[0]
        if isinstance(answer, PlazaError):
            raise answer
        tensors = answer.outputs if isinstance(answer, Response) else answer
        return {t.name: t.to_numpy() for t in tensors}

    def unload(self) -> None:
        """``finalize``, then the process exits (killed if it does not in time, or if a
        batch still runs: that batch then gets its error)."""
        if not self._lock.acquire(timeout=FINALIZE_TIMEOUT_S):
            proc = self._process
            if proc is not None:
                log.warning("%s: a batch still runs at unload: killing it", self.spec.name)
                _signal_group(proc.pid, signal.SIGKILL)  # its batch sees it and cleans up
            return
        try:
            if self._channel is not None:
                try:
                    self._ask({"op": "finalize"}, FINALIZE_TIMEOUT_S, "FINALIZE_TIMEOUT_S")
                except PlazaError as exc:
                    log.warning("%s: finalize: %s", self.spec.name, exc.message)
            self._stop()
        finally:
            self._lock.release()

    # -- the process -----------------------------------------------------------------------
    def _restart(self) -> None:
        """After a crash: the next batch gets a fresh process (initialize runs again)."""
        try:
            self._start()
        except ConfigError as exc:
            raise ModelExecutionError(
                f"model {self.spec.name!r}: restarting its Python process failed: {exc.message}"
            ) from exc

    def _start(self) -> None:
        self._stop()
        self._spawn()
        try:
            reply = self._ask(self._initialize_message(), LOAD_TIMEOUT_S, "LOAD_TIMEOUT_S")
        except PlazaError as exc:
            raise ConfigError(f"{self.mv.path}: {exc.message}", file=str(self.mv.path)) from exc
        if "error" in reply:
            self._stop()
            log.warning("%s: initialize failed:\n%s", self.spec.name, reply.get("traceback", ""))
            raise ConfigError(f"{self.mv.path}: {reply['error']}", file=str(self.mv.path))
        log.info("%s: model.py loaded in process %d", self.spec.name, self.pid)

    @property
    def pid(self) -> int | None:
        """The model process's pid (None when none runs)."""
        return self._process.pid if self._process is not None else None

    def _spawn(self) -> None:
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        env = dict(os.environ)
        # The child imports this very Plaza (a checkout's, not only an installed one).
        root = str(Path(plaza.__file__).parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        argv = [sys.executable, "-m", STUB_MODULE, str(to_child_r), str(from_child_w)]
        # The model process logs as the worker does now: its level and which of WARNING
        # and ERROR pass (its log_warnings, log_errors).
        level, _, warnings, errors = worker_log()
        log_args = [str(level), str(int(warnings)), str(int(errors))]
        self.custom_metrics = []  # a new process's metrics start from nothing
        try:
            # No preexec_fn (unsafe in a threaded parent): the child watches for the
            # worker's exit itself. Its own session keeps a terminal's ^C for the worker,
            # and makes it the leader of a group that holds whatever model.py forks (and
            # not the worker): ``_stop`` ends that group.
            self._process = subprocess.Popen(
                [*argv, str(os.getpid()), *log_args],
                pass_fds=(to_child_r, from_child_w),
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        finally:
            os.close(to_child_r)
            os.close(from_child_w)
        # Its liveness, not only its pipe's close: a process it forked (multiprocessing,
        # os.fork) holds the pipe open after it died.
        self._channel = Channel(from_child_r, to_child_w, alive=partial(_runs, self._process))

    def _ask(self, message: dict[str, Any], timeout_s: float | None, limit: str) -> dict[str, Any]:
        """Send a frame, await the answer; a dead or overdue process becomes a
        ModelExecutionError (and is gone: the next call starts another)."""

        def ask(channel: Channel) -> dict[str, Any]:
            channel.send(message)
            return channel.recv(timeout_s)

        reply = self._exchange(ask, limit, timeout_s)
        self._took_metrics(reply)
        return reply

    def _exchange(
        self, step: Callable[[Channel], T], limit: str, timeout_s: float | None = None
    ) -> T:
        """``step`` on the channel; a dead or overdue process becomes a ModelExecutionError
        (and is gone: the next call starts another)."""
        channel = self._channel
        assert channel is not None
        try:
            return step(channel)
        except ChannelTimeout:
            self._stop(kill=True)
            seconds = self._timeout_s if timeout_s is None else timeout_s
            raise ModelExecutionError(
                f"model {self.spec.name!r}: no answer within {limit}={seconds} s, "
                "so its Python process was killed"
            ) from None
        except ChannelClosed:
            status = self._stop()
            raise ModelExecutionError(
                f"model {self.spec.name!r}: its Python process exited (status {status}) "
                "before answering"
            ) from None

    def _took_metrics(self, reply: dict[str, Any]) -> None:
        metrics = reply.get("metrics")
        if isinstance(metrics, list):  # only what changed: folded into what is kept
            self.custom_metrics = fold(self.custom_metrics, metrics)

    def _stop(self, kill: bool = False) -> int | None:
        """Close the pipes and end the process and its group (at once with ``kill``; else
        it gets FINALIZE_TIMEOUT_S to exit, then what it forked gets as long after
        SIGTERM); its exit status (None if none ran)."""
        proc, self._process = self._process, None
        if kill and proc is not None:
            # First: a cancel frame stuck on its full pipe then fails at once (what the
            # process forked holds that pipe too).
            _signal_group(proc.pid, signal.SIGKILL)
        with self._cancels:  # a cancel frame going out finishes first: its descriptors
            channel, self._channel = self._channel, None  # are never written once closed
        if channel is not None:
            channel.close()
        if proc is None:
            return None
        try:
            status = proc.wait(FINALIZE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            kill = True
            _signal_group(proc.pid, signal.SIGKILL)
            status = proc.wait()
        if not kill:  # killed: SIGKILL reached its whole group already
            _end_group(proc.pid, self.spec.name)
        return status

    def _initialize_message(self) -> dict[str, Any]:
        return {
            "op": "initialize",
            "model_file": str(self.mv.path),
            "model_name": self.spec.name,
            "model_version": self.mv.version,
            "decoupled": self.spec.decoupled,
            "outputs": self._outputs,
            "repository": str(self.mv.path.parent.parent.parent),
            "settings": self._settings_json,
            "args": initialize_args(self.mv, self.device, self.instance),
            "log": worker_log(),
        }

    def _answer(self, req: InferRequest, raw: bytes) -> Answer:
        """One response from the model's process as the request's answer: never raises (a
        decoupled batch's frames must all be read), a response it cannot take is the
        request's ``model_error``."""
        try:
            result = decode_result(raw)
        except PlazaError as exc:
            return ModelExecutionError(f"model {self.spec.name!r}: {exc.message}")
        if result.error is not None:
            return answer_error(result.error.code, result.error.message)
        given = {t.name: t for t in result.outputs}
        wanted = list(req.outputs) or self._outputs
        missing = [n for n in wanted if n not in given]
        if missing:
            return ModelExecutionError(
                f"model {self.spec.name!r}: its response has no output {missing[0]!r} "
                f"(it has {sorted(given)})"
            )
        outputs = tuple(given[n] for n in wanted)
        return Response(outputs, result.parameters) if result.parameters else outputs


def _execute_message(requests: Sequence[InferRequest]) -> dict[str, Any]:
    """A batch for the model's process, with how the worker logs now (``worker_log``): a
    change of the log settings at run time reaches the model's process with its next
    batch."""
    encoded = [encode_request(r) for r in requests]
    return {"op": "execute", "requests": encoded, "log": worker_log()}


def worker_log(root: logging.Logger | None = None) -> list[Any]:
    """How this worker logs now, for its model's process to copy (``python_stub``): its
    level and time format (``log_state``), then whether its WARNING and whether its ERROR
    records pass (the ``SeverityFilter`` of its handlers: ``log_warnings``,
    ``log_errors``)."""
    root = root or logging.getLogger()
    kept = [f for h in root.handlers for f in h.filters if isinstance(f, SeverityFilter)]
    return [*log_state(root), all(f.warnings for f in kept), all(f.errors for f in kept)]


def _runs(process: subprocess.Popen[bytes]) -> bool:
    return process.poll() is None


def _signal_group(pgid: int, signum: int) -> bool:
    """``signum`` to every process of the group; False when none is left (or none is ours
    any more). The group outlives its leader while a member runs, so this reaches what the
    model's process forked after that process has exited and been reaped."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _group_runs(pgid: int) -> bool:
    """Whether a process of the group is left. Members this worker must reap (it is their
    reaper as PID 1 of a container, say) are reaped first: a zombie is not left."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-pgid, os.WNOHANG)[0]:
            pass
    return _signal_group(pgid, 0)  # signal 0: only looks


def _end_group(pgid: int, model: str) -> None:
    """End what the model's process (the group's leader, exited) left in its group:
    SIGTERM, then SIGKILL for what still runs after FINALIZE_TIMEOUT_S."""
    if not _signal_group(pgid, signal.SIGTERM):
        return
    deadline = time.monotonic() + FINALIZE_TIMEOUT_S
    while _group_runs(pgid):
        if time.monotonic() >= deadline:
            log.warning("%s: a process model.py forked outlived SIGTERM: killing it", model)
            _signal_group(pgid, signal.SIGKILL)
            return
        time.sleep(GROUP_POLL_S)


def _frames_of(ids: Sequence[str]) -> Iterator[list[str]]:
    """``ids`` in cancel frames small enough (``select.PIPE_BUF``) that a pipe with room
    takes each at once."""
    part: list[str] = []
    size = 0
    for rid in ids:
        cost = len(rid.encode()) + 5  # msgpack's string header at most
        if part and size + cost > select.PIPE_BUF - 32:  # 32: the frame's header and keys
            yield part
            part, size = [], 0
        part.append(rid)
        size += cost
    if part:
        yield part


def initialize_args(mv: ModelVersion, device: Device, instance: int = 0) -> dict[str, str]:
    """``initialize``'s ``args`` for the model's instance ``instance`` (counted across its
    instance groups), every value a string, as Triton passes them."""
    gpu = device.kind == "cuda"
    return {
        "model_config": json.dumps(triton_config_json(mv)),
        "model_instance_kind": "GPU" if gpu else "CPU",
        "model_instance_name": instance_name(mv.spec, instance),
        "model_instance_device_id": str(device.index if gpu else 0),
        "model_repository": str(mv.path.parent.parent),
        "model_version": str(mv.version),
        "model_name": mv.spec.name,
    }


def instance_name(spec: ModelSpec, instance: int) -> str:
    """Triton's name for the model's instance ``instance`` (counted across its instance
    groups in order): its group's ``name`` (by default ``<model>_<group index>``), then
    ``_<its index within the group>``; ``<model>_0_0`` for a model without groups."""
    named = spec.config.instance_group
    left = instance
    for g, group in enumerate(spec.instance_groups):
        if left < group.count:
            prefix = named[g].name if g < len(named) and named[g].name else f"{spec.name}_{g}"
            return f"{prefix}_{left}"
        left -= group.count
    raise ValueError(f"model {spec.name!r} has {spec.instance_count} instances, not {instance + 1}")


def triton_config_json(mv: ModelVersion) -> dict[str, Any]:
    """The model config as Triton's JSON: field names as in config.pbtxt, int64 values as
    numbers (not protobuf's strings), and the fields model.py files read always present."""
    config = mv.spec.config
    body: dict[str, Any] = json_format.MessageToDict(config, preserving_proto_field_name=True)
    int64_as_numbers(body, config.DESCRIPTOR)
    body.setdefault("name", mv.spec.name)
    body.setdefault("backend", "python")
    body.setdefault("max_batch_size", 0)
    body.setdefault("input", [])
    body.setdefault("output", [])
    body.setdefault("parameters", {})
    for entry in (*body["input"], *body["output"]):
        entry.setdefault("dims", [])
    return body


def _execute_timeout(mv: ModelVersion) -> float | None:
    raw = mv.spec.parameters.get("execute_timeout_s", "0") or "0"
    try:
        seconds = float(raw)
    except ValueError:
        raise ConfigError(
            f"{mv.spec.name}: parameter execute_timeout_s={raw!r} is not a number",
            field="parameters.execute_timeout_s",
        ) from None
    return seconds if seconds > 0 else None


def settings_json(settings: PlazaSettings) -> str:
    """Settings for the child's BLS client, secrets included (it is the worker's own)."""

    def plain(value: Any) -> Any:
        if isinstance(value, SecretStr):
            return value.get_secret_value()
        if isinstance(value, Path):
            return str(value)
        raise TypeError(f"cannot send {type(value).__name__} to the model process")

    return json.dumps(settings.model_dump(), default=plain)
