"""ONNX Runtime backend (platform onnxruntime_onnx); CUDA provider when on a GPU."""

from __future__ import annotations

import logging

import onnxruntime as ort

from plaza.errors import ConfigError
from plaza.repository import ModelVersion
from plaza.workers.backends.base import Arrays
from plaza.workers.device import Device

log = logging.getLogger(__name__)


class OnnxBackend:
    """One InferenceSession with explicit thread settings."""

    def __init__(self, mv: ModelVersion, device: Device, threads: int) -> None:
        self.mv = mv
        self.device = device
        self.threads = threads
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
            "%s v%d loaded on %s, providers %s, %d intra-op threads",
            self.mv.spec.name,
            self.mv.version,
            self.device,
            self._session.get_providers(),
            self.threads,
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
