"""ONNX Runtime backend (platform onnxruntime_onnx); CUDA provider when on a GPU."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, NoReturn

import onnxruntime as ort

from plaza.autocomplete import ONNX_TYPES
from plaza.datatypes import from_config_type
from plaza.errors import ConfigError
from plaza.modelconfig import TensorSpec
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


def _disagreement(onnx_type: str, shape: Any, tensor: TensorSpec, batched: bool) -> str:
    """Why the model's ``onnx_type`` and ``shape`` cannot take ``tensor`` as configured
    ("" when they can). A free dimension of the model takes any configured size; a fixed one
    takes only its own (a configured -1 would let requests through that it refuses)."""
    config_type = ONNX_TYPES.get(onnx_type)
    if config_type is None or from_config_type(config_type) != tensor.datatype:
        return f"is {tensor.datatype} but the model's is {onnx_type}"
    if shape is None:
        return ""  # the model does not say
    dims = tensor.dims if tensor.reshape is None else tensor.reshape
    wanted = [-1, *dims] if batched else list(dims)
    shown = f"the model's shape is {list(shape)}, the config's {wanted}"
    if len(shape) != len(wanted):
        return f"does not fit: {shown}"
    if batched and isinstance(shape[0], int) and shape[0] >= 0:
        return f"cannot batch: {shown} (the model's first dimension is fixed)"
    start = 1 if batched else 0  # the batch dimension was judged above
    for have, want in zip(shape[start:], wanted[start:], strict=True):
        if isinstance(have, int) and have >= 0 and have != want:
            return f"does not fit: {shown}"
    return ""


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
        self._check_signature()
        log.info(
            "%s v%d loaded on %s, providers %s, %d intra-op threads, spinning %s",
            self.mv.spec.name,
            self.mv.version,
            self.device,
            self._session.get_providers(),
            self.threads,
            "on" if self.tuning.intra_op_spinning else "off",
        )

    def _check_signature(self) -> None:
        """The config's tensors against the model's, as Triton checks them at load: each
        name there, of the same type, of a shape the model takes (``reshape``'s where the
        config has one), with a free first dimension where the config batches. As in
        Triton, an ``optional`` input may also be an overridable initializer of the model
        (a request that sends it overrides it; one that does not gets its value). A
        mismatch is a ``bad_config`` now, not a failure of every request later."""
        assert self._session is not None
        spec = self.mv.spec
        seq = spec.sequence
        # A stateful model's control and state tensors, which Plaza fills and takes
        controls = [TensorSpec(c.name, c.datatype, (1,)) for c in seq.controls]
        states_in = [TensorSpec(s.input_name, s.datatype, s.dims) for s in seq.states]
        states_out = [TensorSpec(s.output_name, s.datatype, s.dims) for s in seq.states]
        initializers = {a.name: a for a in self._session.get_overridable_initializers()}
        for kind, specs, args, spare in (
            (
                "input",
                [*spec.inputs, *controls, *states_in],
                self._session.get_inputs(),
                initializers,
            ),
            ("output", [*spec.outputs, *states_out], self._session.get_outputs(), {}),
        ):
            graph = {a.name: a for a in args}
            for tensor in specs:
                arg = graph.get(tensor.name)
                if arg is None:
                    arg = self._stand_in(kind, tensor, spare, sorted(graph))
                why = _disagreement(arg.type, arg.shape, tensor, spec.max_batch_size > 0)
                if why:
                    self._mismatch(kind, tensor.name, why)

    def _stand_in(
        self, kind: str, tensor: TensorSpec, initializers: dict[str, Any], names: list[str]
    ) -> Any:
        """The overridable initializer that ``tensor``, which is not among the model's
        ``names``, stands for: only an ``optional`` input may be one."""
        arg = initializers.get(tensor.name)
        if arg is None:
            self._mismatch(kind, tensor.name, f"is not in the model (it has {names})")
        if not tensor.optional:
            self._mismatch(
                kind,
                tensor.name,
                "is only an overridable initializer of the model, which has a value of its "
                "own: mark the input optional: true to let requests override it",
            )
        return arg

    def _mismatch(self, kind: str, name: str, why: str) -> NoReturn:
        raise ConfigError(
            f"{self.mv.path}: config {kind} {name!r} {why}", file=str(self.mv.path), field=kind
        )

    def infer(self, inputs: Arrays, outputs: list[str]) -> Arrays:
        if self._session is None:
            raise RuntimeError("backend not loaded")
        return dict(zip(outputs, self._session.run(outputs, inputs), strict=True))

    def unload(self) -> None:
        self._session = None
