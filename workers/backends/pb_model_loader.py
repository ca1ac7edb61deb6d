"""Triton's model loading API in a Python model's process: what ``pb_utils.load_model``,
``unload_model`` and ``is_model_ready`` do.

Each call runs Plaza's model control (``plaza.model_control.ModelControl``: the steps of the
gateway's repository API, read the model, mark it in the model table, create its topics,
wait up to ``gateway.load_timeout_s`` for a live worker) on a private event loop thread, with
one Redis client for the process; both are made on the first call that needs them. The
arguments are checked first, by pure functions, as Triton checks them: loads and unloads
need model control mode explicit (``gateway.model_control_mode``, which every process of a
deployment gets), and ``files`` are refused as the gateway refuses ``file:`` overrides.
Failures reach the model as TritonModelException with Triton's prefixes ("Failed to load
model: ...").
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from plaza.errors import PlazaError
from plaza.model_control import (
    FILE_OVERRIDES_REFUSED,
    MODEL_CONTROL_DISABLED,
    ControlMode,
    ModelControl,
)
from plaza.repository import ModelRepository
from plaza.settings import PlazaSettings
from plaza.workers.backends.pb_exception import TritonModelException

if TYPE_CHECKING:
    import redis.asyncio as aioredis

T = TypeVar("T")

LOAD_FAILED = "Failed to load model: "
UNLOAD_FAILED = "Failed to unload model: "
READINESS_FAILED = "Failed to check model readiness: "
"""Triton's prefixes of the three calls' errors."""
CLOSE_TIMEOUT_S = 5.0


# -- the checks (no I/O) ---------------------------------------------------------------------
def check_mode(mode: ControlMode, prefix: str) -> None:
    """Loads and unloads need model control mode explicit, as in Triton."""
    if mode != "explicit":
        raise TritonModelException(
            f"{prefix}{MODEL_CONTROL_DISABLED} (the model loading API needs model control "
            f"mode explicit; gateway.model_control_mode is {mode!r})"
        )


def check_name(name: object, prefix: str) -> str:
    if not isinstance(name, str) or not name:
        raise TritonModelException(f"{prefix}model_name must be a non-empty string")
    return name


def check_load(name: object, config: object, files: object, mode: ControlMode) -> None:
    """``load_model``'s arguments: a name, a config string (Triton's JSON form, or ""), no
    files (an empty dict is none), and mode explicit."""
    check_name(name, LOAD_FAILED)
    if not isinstance(config, str):
        raise TritonModelException(
            f"{LOAD_FAILED}failed to load '{name}': config must be a string (a model config "
            "as JSON)"
        )
    if files is not None and not isinstance(files, dict):
        raise TritonModelException(
            f"{LOAD_FAILED}failed to load '{name}': files should be a dictionary of file paths "
            "and file contents"
        )
    if files:
        refused = f"failed to load '{name}': files=...: {FILE_OVERRIDES_REFUSED}"
        raise TritonModelException(f"{LOAD_FAILED}{refused}")
    check_mode(mode, LOAD_FAILED)


def check_unload(name: object, mode: ControlMode) -> None:
    check_name(name, UNLOAD_FAILED)
    check_mode(mode, UNLOAD_FAILED)


def parse_version(version: object) -> int | None:
    """``is_model_ready``'s version string: "" for any (None), else an integer >= 0."""
    if version == "":
        return None
    if not isinstance(version, str) or not version.isdigit():
        raise TritonModelException(
            f"{READINESS_FAILED}failed to get model version from specified version string "
            f"{version!r}, version should be an integral value > 0"
        )
    return int(version)


# -- the calls -------------------------------------------------------------------------------
class ModelLoader:
    """The model loading API of one model process (``pb_utils.ModelLoading``)."""

    def __init__(self, settings: Callable[[], PlazaSettings]) -> None:
        self._make_settings = settings
        self._settings: PlazaSettings | None = None
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._control: ModelControl | None = None
        self._redis: aioredis.Redis | None = None
        """The process's one Redis client (made on the first call, used only on the loop)."""

    def load(self, name: str, config: str, files: dict[str, bytes] | None) -> None:
        check_load(name, config, files, self._mode())
        self._run(LOAD_FAILED, self._started().load(name, config))

    def unload(self, name: str, unload_dependents: bool) -> None:
        check_unload(name, self._mode())
        control = self._started()
        self._run(UNLOAD_FAILED, control.unload(name, with_dependents=bool(unload_dependents)))

    def ready(self, name: str, version: str) -> bool:
        check_name(name, READINESS_FAILED)
        number = parse_version(version)
        control = self._started()
        return self._run(READINESS_FAILED, control.ready(name, number, mode=self._mode()))

    def close(self) -> None:
        """Close the Redis client and stop the loop (the model's process ends)."""
        with self._lock:
            loop, thread, redis = self._loop, self._thread, self._redis
            self._loop, self._thread, self._control, self._redis = None, None, None, None
        if loop is None or thread is None or redis is None:
            return
        closing = asyncio.run_coroutine_threadsafe(redis.aclose(), loop)
        with contextlib.suppress(Exception):
            closing.result(CLOSE_TIMEOUT_S)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(CLOSE_TIMEOUT_S)
        if not thread.is_alive():
            loop.close()

    # -- helpers -------------------------------------------------------------------------
    def _mode(self) -> ControlMode:
        return self._resolved().gateway.model_control_mode

    def _resolved(self) -> PlazaSettings:
        with self._lock:
            if self._settings is None:
                self._settings = self._make_settings()
            return self._settings

    def _started(self) -> ModelControl:
        """The model control, its loop thread and Redis client started on the first call."""
        from plaza.connections import redis_client  # Redis is imported on the first call only

        settings = self._resolved()
        with self._lock:
            if self._control is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=self._loop.run_forever, daemon=True, name="plaza-model-loader"
                )
                self._thread.start()
                repo = ModelRepository.of(settings)
                self._redis = redis_client(settings.redis)
                self._control = ModelControl(
                    self._redis,
                    settings.names,
                    settings.kafka,
                    repo,
                    settings.gateway.load_timeout_s,
                )
            return self._control

    def _run(self, prefix: str, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait; a failure as TritonModelException."""
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result()
        except PlazaError as exc:
            raise TritonModelException(f"{prefix}{exc.message}") from exc
        except Exception as exc:  # Redis or Kafka did not answer
            raise TritonModelException(f"{prefix}{type(exc).__name__}: {exc}") from exc
