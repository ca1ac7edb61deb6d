"""ONNX Runtime backend (platform onnxruntime_onnx); CUDA provider when on a GPU."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import onnxruntime as ort

from plaza.errors import ConfigError
from plaza.repository import ModelVersion
from plaza.settings import WorkerSettings
from plaza.workers.backends.base import Arrays
from plaza.workers.device import Device

log = logging.getLogger(__name__)

_WORKER_FIELDS = WorkerSettings.model_fields


@dataclass(frozen=True, slots=True)
class SessionTuning:
    """The ONNX Runtime session options a worker sets beyond the thread count (defaults:
    the worker settings' defaults, chosen by measurement, docs/benchmarks.md)."""

    intra_op_spinning: bool = _WORKER_FIELDS["ort_intra_op_spinning"].default
    """session.intra_op.allow_spinning"""
    inter_op_spinning: bool = _WORKER_FIELDS["ort_inter_op_spinning"].default
    """session.inter_op.allow_spinning"""

    @classmethod
    def from_settings(cls, ws: WorkerSettings) -> SessionTuning:
        return cls(ws.ort_intra_op_spinning, ws.ort_inter_op_spinning)

    def apply(self, opts: ort.SessionOptions) -> None:
        """Set these options on ``opts``."""
        opts.add_session_config_entry(
            "session.intra_op.allow_spinning", "1" if self.intra_op_spinning else "0"
        )
        opts.add_session_config_entry(
            "session.inter_op.allow_spinning", "1" if self.inter_op_spinning else "0"
        )


class OnnxBackend:
    """One InferenceSession with explicit thread and spinning settings (``tuning`` None:
    the worker settings' defaults)."""

    def __init__(
        self, mv: ModelVersion, device: Device, threads: int, tuning: SessionTuning | None = None
    ) -> None:
        self.mv = mv
        self.device = device
        self.threads = threads
        self.tuning = tuning or SessionTuning()
        self._session: ort.InferenceSession | None = None

    def _providers(self) -> list[str | tuple[str, dict[str, object]]]:
        available = ort.get_available_providers()
        if self.device.kind == "cuda":
            if "CUDAExecutionProvider" in available:
                return [
                    ("CUDAExecutionProvider", {"device_id": self.device.index}),
                    "CPUExecutionProvider",
                ]
            log.warning(
                "%s: a GPU is visible but onnxruntime has no CUDA provider "
                "(install the gpu extra); running on cpu",
                self.mv.spec.name,
            )
        return ["CPUExecutionProvider"]

    def load(self) -> None:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = self.threads
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.tuning.apply(opts)
        try:
            self._session = ort.InferenceSession(
                str(self.mv.path), sess_options=opts, providers=self._providers()
            )
        except Exception as exc:  # onnxruntime raises its own unrelated exception types
            raise ConfigError(
                f"{self.mv.path}: onnxruntime cannot load it: {exc}", file=str(self.mv.path)
            ) from exc
        self._check_names()
        log.info(
            "%s v%d loaded on %s, providers %s, %d intra-op threads, spinning %s",
            self.mv.spec.name,
            self.mv.version,
            self.device,
            self._session.get_providers(),
            self.threads,
            "on" if self.tuning.intra_op_spinning else "off",
        )

    def _check_names(self) -> None:
        assert self._session is not None
        graph_in = {i.name for i in self._session.get_inputs()}
        graph_out = {o.name for o in self._session.get_outputs()}
        for kind, specs, names in (
            ("input", self.mv.spec.inputs, graph_in),
            ("output", self.mv.spec.outputs, graph_out),
        ):
            for spec in specs:
                if spec.name not in names:
                    raise ConfigError(
                        f"{self.mv.path}: config {kind} {spec.name!r} is not in the model "
                        f"(it has {sorted(names)})",
                        file=str(self.mv.path),
                        field=kind,
                    )

    def infer(self, inputs: Arrays, outputs: list[str]) -> Arrays:
        if self._session is None:
            raise RuntimeError("backend not loaded")
        return dict(zip(outputs, self._session.run(outputs, inputs), strict=True))

    def unload(self) -> None:
        self._session = None
