"""config.pbtxt, read with protobuf's text format into Triton's own ModelConfig message.

``load_model_config`` parses (no home-made parser) and ``ModelSpec`` is the frozen view the
rest of Plaza uses: tensor specs with KServe datatypes, the batching policy, queue policies,
the version policy and the instance count. Errors name the file and the field.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2 as mc

from plaza import reshape as reshaping
from plaza.datatypes import from_config_type
from plaza.ensembles import EnsembleStep, check_graph
from plaza.errors import ConfigError
from plaza.model_metrics import DEFAULT_BUCKETS, Buckets, histogram_buckets
from plaza.naming import METRIC_FIRST_RESPONSE_HISTOGRAM, check_model_name
from plaza.sequence_config import SequenceBatching, parse_sequence_batching

log = logging.getLogger(__name__)

PLATFORM_ONNX = "onnxruntime_onnx"
PLATFORM_TORCH = "pytorch_libtorch"
BACKEND_SIMULATED = "plaza_simulated"
BACKEND_PYTHON = "python"
"""Triton's Python backend: ``<version>/model.py`` defines ``TritonPythonModel``."""
PLATFORM_ENSEMBLE = "ensemble"
"""Runs no backend: an ensemble runner (``workers/ensemble.py``) calls its steps' models."""
_BACKEND_PLATFORM = {"onnxruntime": PLATFORM_ONNX, "pytorch": PLATFORM_TORCH}
"""The backends Triton ties to a platform that Plaza serves (Triton checks the pair)."""
_PLATFORM_BACKEND = {platform: backend for backend, platform in _BACKEND_PLATFORM.items()}
DEFAULT_FILENAMES = {
    PLATFORM_ONNX: "model.onnx",
    PLATFORM_TORCH: "model.pt",
    BACKEND_PYTHON: "model.py",
}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """An input or output as configured: dims exclude the batch dim when batching."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    optional: bool = False
    reshape: tuple[int, ...] | None = None
    """Triton's ``reshape``: the shape the model takes (an input) or makes (an output) past
    the batch dim, when it is not ``dims`` (``plaza.reshape``); None: ``dims``."""


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """Triton's ModelQueuePolicy for one priority level."""

    reject_on_timeout: bool = True
    """timeout_action REJECT (True) or DELAY (False)."""
    default_timeout_us: int = 0
    """0: no timeout."""
    allow_timeout_override: bool = False
    max_queue_size: int = 0
    """0: unbounded (Plaza still bounds what a worker holds in memory)."""


@dataclass(frozen=True, slots=True)
class DynamicBatching:
    """The dynamic_batching block; ``enabled`` is False when the block is absent."""

    enabled: bool = False
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy = field(default_factory=QueuePolicy)
    priority_queue_policy: dict[int, QueuePolicy] = field(default_factory=dict)

    def queue_policy(self, level: int) -> QueuePolicy:
        return self.priority_queue_policy.get(level, self.default_queue_policy)


@dataclass(frozen=True, slots=True)
class VersionPolicy:
    """latest N, all, or specific versions."""

    kind: str = "latest"
    latest: int = 1
    specific: tuple[int, ...] = ()
    source: str = field(default="", compare=False)
    """The config it was read from, named by the warning about a missing version."""
    _warned: set[int] = field(default_factory=set, compare=False, repr=False)
    """The specific versions already warned about (once per parsed config, not per call)."""

    def select(self, available: list[int], *, quiet: bool = False) -> list[int]:
        """The versions of ``available`` the policy serves, oldest first. A specific version
        with no folder is logged (a warning, once: Triton logs an error per missing version)
        unless ``quiet``."""
        ordered = sorted(available)
        if self.kind == "all":
            return ordered
        if self.kind == "specific":
            if not quiet:
                self._warn_missing(ordered)
            return [v for v in ordered if v in self.specific]
        return ordered[-self.latest :] if self.latest > 0 else []

    def _warn_missing(self, available: list[int]) -> None:
        for version in self.specific:
            if version not in available and version not in self._warned:
                self._warned.add(version)
                log.warning(
                    "%s: version_policy.specific.versions names version %d, which has no "
                    "version folder: it is not served",
                    self.source or "a model config",
                    version,
                )


@dataclass(frozen=True, slots=True)
class RateLimitResource:
    """A resource an execution of an instance takes from its host while it runs."""

    name: str
    count: int
    shared: bool = False
    """Triton's ``global``: one budget per machine rather than per device (Plaza's hosts have
    one device each, so both kinds come from the host's budget)."""


@dataclass(frozen=True, slots=True)
class InstanceGroup:
    """One ``instance_group`` entry: ``count`` instances of one kind, and their rate limiter."""

    count: int = 1
    kind: str = "KIND_AUTO"
    gpus: tuple[int, ...] = ()
    """``gpus``: the GPU ids named (CUDA's numbering); a worker on a GPU refuses ids it
    cannot see (``workers/device.py``), one on the CPU ignores them, as it does ``kind``."""
    resources: tuple[RateLimitResource, ...] = ()
    """What each execution of one of these instances needs (``rate_limiter.resources``)."""
    priority: int = 1
    """``rate_limiter.priority``: a weight on the fair share; 2 gets half the turns of 1."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What Plaza needs to know about one model, taken from its config.pbtxt."""

    name: str
    platform: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    batching: DynamicBatching
    version_policy: VersionPolicy
    instance_count: int
    default_model_filename: str
    parameters: dict[str, str]
    config: mc.ModelConfig
    """The parsed message itself (served by the /config endpoint)."""
    response_cache: bool = False
    """``response_cache { enable: true }``: answers are cached (``plaza.response_cache``)."""
    instance_groups: tuple[InstanceGroup, ...] = (InstanceGroup(),)
    """The instance groups (one of count 1 when the config has none)."""
    max_concurrency: int = 0
    """Parameter ``max_concurrency``: executions of this model running at once on a host,
    at most (0: no cap beyond the instance count)."""
    ensemble_steps: tuple[EnsembleStep, ...] = ()
    """``ensemble_scheduling.step`` of a ``platform: "ensemble"`` model (``plaza.ensembles``)."""
    sequence: SequenceBatching = field(default_factory=SequenceBatching)
    """``sequence_batching``: a stateful model's sequences (``plaza.sequence_config``)."""
    histogram_buckets: dict[str, Buckets] = field(default_factory=lambda: dict(DEFAULT_BUCKETS))
    """Bucket bounds by histogram family (``model_metrics``, ``plaza.model_metrics``)."""

    @property
    def decoupled(self) -> bool:
        """``model_transaction_policy { decoupled: true }``: the model may answer a request
        with any number of responses, the last one marked final (``InferResult.final``)."""
        return bool(self.config.model_transaction_policy.decoupled)

    @property
    def first_response_buckets_ms(self) -> Buckets:
        """The bounds of the model's ``nv_inference_first_response_histogram_ms``."""
        return self.histogram_buckets[METRIC_FIRST_RESPONSE_HISTOGRAM]

    @property
    def max_inflight_requests(self) -> int:
        """``ensemble_scheduling.max_inflight_requests``: an ensemble's step requests in
        flight at each of its steps, over all its requests (0: no limit; Triton's)."""
        return int(self.config.ensemble_scheduling.max_inflight_requests)

    @property
    def is_ensemble(self) -> bool:
        """An ensemble: served by an ensemble runner, not by a backend."""
        return self.platform == PLATFORM_ENSEMBLE

    def input(self, name: str) -> TensorSpec | None:
        return next((t for t in self.inputs if t.name == name), None)

    def output(self, name: str) -> TensorSpec | None:
        return next((t for t in self.outputs if t.name == name), None)

    def config_json(self) -> dict[str, Any]:
        """The config as Triton's model-config endpoint returns it (``config_to_json``)."""
        return config_to_json(self.config)


_PRINT_DEFAULTS = (
    "always_print_fields_with_no_presence"
    if "always_print_fields_with_no_presence"
    in inspect.signature(json_format.MessageToDict).parameters
    else "including_default_value_fields"
)
"""protobuf's name for printing fields at their default (renamed in protobuf 5.26)."""
_INT64_TYPES = frozenset(
    {
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    }
)


def config_to_json(config: mc.ModelConfig) -> dict[str, Any]:
    """``config`` in Triton's JSON form (its ``ModelConfigToJson``): field names as in
    config.pbtxt, every primitive field printed even at its default (``max_batch_size: 0``,
    an input's ``format``), and 64-bit integers as JSON numbers, not protobuf's strings
    (map keys stay strings, as JSON's keys are). ``json_format.Parse`` reads it back."""
    doc: dict[str, Any] = json_format.MessageToDict(
        config, preserving_proto_field_name=True, **{_PRINT_DEFAULTS: True}
    )
    int64_as_numbers(doc, config.DESCRIPTOR)
    return doc


def int64_as_numbers(doc: dict[str, Any], descriptor: Descriptor) -> None:
    """Turn the 64-bit integer fields of ``doc`` (a message of type ``descriptor`` as
    ``MessageToDict`` prints it), repeated, in messages or map values, into numbers."""
    for fd in descriptor.fields:
        if fd.name not in doc:
            continue
        value = doc[fd.name]
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            inner = fd.message_type.fields_by_name["value"]
            doc[fd.name] = {key: _as_number(item, inner) for key, item in value.items()}
        elif isinstance(value, list):
            doc[fd.name] = [_as_number(item, fd) for item in value]
        else:
            doc[fd.name] = _as_number(value, fd)


def _as_number(value: Any, fd: FieldDescriptor) -> Any:
    if fd.type in _INT64_TYPES:
        return int(value)
    if fd.message_type is not None:
        int64_as_numbers(value, fd.message_type)
    return value


Completion = Callable[[mc.ModelConfig], None]
"""Fills in what a parsed config leaves out, before it is checked (``plaza.autocomplete``)."""


def parse_model_config(
    text: str, *, source: str, default_name: str, complete: Completion | None = None
) -> ModelSpec:
    """Parse config.pbtxt text (then ``complete`` it); ConfigError naming ``source`` and
    the field on any problem."""
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise _parse_error(exc, text, source) from exc
    return _completed_spec(config, source, default_name, complete)


def parse_model_config_json(
    text: str, *, source: str, default_name: str, complete: Completion | None = None
) -> ModelSpec:
    """Parse a config in Triton's JSON form (a load request's ``parameters.config``), then
    ``complete`` it."""
    config = mc.ModelConfig()
    try:
        json_format.Parse(text, config)
    except json_format.ParseError as exc:
        raise ConfigError(f"{source}: {_printable(str(exc))}", file=source) from exc
    return _completed_spec(config, source, default_name, complete)


def _completed_spec(
    config: mc.ModelConfig, source: str, default_name: str, complete: Completion | None
) -> ModelSpec:
    """Check a parsed config's enum numbers, ``complete`` it, check them again (a Python
    model's hook may write a number, ``data_type: 99``), and read it."""
    _check_enums(config, source)  # before completion: it may read them
    if complete is not None:
        complete(config)
        name = config.name or default_name
        _check_enums(config, f"{source}: the config completed for model {name!r}")
    return _spec_from_config(config, source=source, default_name=default_name)


_NOT_UTF8 = re.compile("[\udc80-\udcff]")
"""What a byte that is not UTF-8 decodes to with ``surrogateescape``."""


def _parse_error(exc: text_format.ParseError, text: str, source: str) -> ConfigError:
    """The ConfigError of a text that does not parse; one that names the line when that
    line holds bytes that are not UTF-8 outside a comment (a string must be UTF-8)."""
    number = exc.GetLine() or 0
    lines = text.split("\n")
    if 0 < number <= len(lines) and _NOT_UTF8.search(lines[number - 1]):
        message = f"line {number} holds bytes that are not UTF-8 (only a comment may)"
        return ConfigError(f"{source}: {message}", file=source)
    return ConfigError(f"{source}: {_printable(str(exc))}", file=source)


def _printable(message: str) -> str:
    """``message`` with any lone surrogate (a byte that was not UTF-8) as an escape."""
    return message.encode("utf-8", "backslashreplace").decode("utf-8")


def _check_enums(message: Message, source: str, prefix: str = "") -> None:
    """Refuse an enum field holding a number its enum has no name for (protobuf keeps any
    number for Triton's open enums, from text or JSON alike; Triton knows none of them):
    ConfigError naming the field, e.g. ``input[0].data_type``."""
    for fd, value in message.ListFields():
        where = f"{prefix}{fd.name}"
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            inner = fd.message_type.fields_by_name["value"]
            for key, item in value.items():
                _check_enum_value(inner, item, source, f"{where}[{key}]")
        elif fd.is_repeated:
            for i, item in enumerate(value):
                _check_enum_value(fd, item, source, f"{where}[{i}]")
        else:
            _check_enum_value(fd, value, source, where)


def _check_enum_value(fd: FieldDescriptor, value: Any, source: str, where: str) -> None:
    if fd.message_type is not None:
        _check_enums(value, source, f"{where}.")
    elif fd.enum_type is not None and value not in fd.enum_type.values_by_number:
        names = ", ".join(v.name for v in fd.enum_type.values)
        raise _fail(source, where, f"{value} is not a {fd.enum_type.name} ({names})")


def load_model_config(
    path: Path, complete: Completion | None = None, name: str | None = None
) -> ModelSpec:
    """Read ``<model>/config.pbtxt``; the model name defaults to ``name``, else to the
    folder's name."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}", file=str(path)) from exc
    # Triton's parser reads bytes: a comment may hold any (a Latin-1 one, say). Bytes that
    # are not UTF-8 are kept apart (surrogateescape), so only a string holding them fails.
    text = raw.decode("utf-8", "surrogateescape")
    default = name or path.parent.name
    return parse_model_config(text, source=str(path), default_name=default, complete=complete)


_fail = ConfigError.at


def _check_backend(config: mc.ModelConfig, source: str) -> None:
    """A named backend: one Plaza serves, not beside ``platform: "ensemble"``, and, for a
    backend Triton ties to a platform, beside that platform only (Triton: "unexpected
    'platform' and 'backend' pair"). Like Triton, the Python backend takes any platform."""
    backend, platform = config.backend, config.platform
    if not backend:
        return
    served = (*_BACKEND_PLATFORM, BACKEND_PYTHON, BACKEND_SIMULATED)
    if backend not in served:
        supported = ", ".join(served)
        raise _fail(source, "backend", f"unsupported backend {backend!r} (supported: {supported})")
    if platform == PLATFORM_ENSEMBLE:
        raise _fail(source, "backend", f"{backend!r}: an ensemble names no backend")
    expected = _BACKEND_PLATFORM.get(backend, platform)
    if platform and platform != expected:
        raise _fail(
            source,
            "backend",
            f"unexpected 'platform' and 'backend' pair {platform!r}, {backend!r} "
            f"(backend {backend!r} is platform {expected!r})",
        )


def _platform(config: mc.ModelConfig, source: str) -> str:
    _check_backend(config, source)
    if config.backend == "plaza_simulated" or config.platform == BACKEND_SIMULATED:
        return BACKEND_SIMULATED
    if config.backend == BACKEND_PYTHON:
        return BACKEND_PYTHON
    platform = config.platform or _BACKEND_PLATFORM.get(config.backend, "")
    if platform not in (PLATFORM_ONNX, PLATFORM_TORCH, PLATFORM_ENSEMBLE):
        raise _fail(
            source,
            "platform",
            f"unsupported platform/backend {config.platform or config.backend!r} "
            f"(supported: {PLATFORM_ONNX}, {PLATFORM_TORCH}, {PLATFORM_ENSEMBLE}, backends "
            f"{BACKEND_PYTHON}, {BACKEND_SIMULATED})",
        )
    return platform


_SEQUENCE_PLATFORMS = (PLATFORM_ONNX, PLATFORM_TORCH, BACKEND_PYTHON)
"""What may be stateful: the backends that take the control and state inputs."""
_TENSOR_NOT_BUILT = {
    "allow_ragged_batch": "Plaza has no ragged batching",
    "is_shape_tensor": "Plaza has no shape tensors",
}


def _refuse_unbuilt(config: mc.ModelConfig, platform: str, source: str) -> None:
    """Refuse the config fields whose meaning Plaza does not carry out: served without it,
    such a model would get the wrong batches or the wrong shapes (a stateful model its
    sequences interleaved), not an error. Fields that only tune speed (optimization) are
    read and ignored."""
    if config.HasField("sequence_batching") and platform not in _SEQUENCE_PLATFORMS:
        why = "Plaza batches sequences for ONNX Runtime, PyTorch and Python backend models"
        raise _fail(source, "sequence_batching", f"is not supported for {platform}: {why}")
    if config.model_transaction_policy.decoupled:
        field_name = "model_transaction_policy.decoupled"
        if platform not in (BACKEND_PYTHON, PLATFORM_ENSEMBLE):
            why = (
                "Plaza's decoupled models are Python backend models (a response sender) "
                "and ensembles over one"
            )
            raise _fail(source, field_name, f"is not supported for {platform}: {why}")
        if config.HasField("sequence_batching"):
            raise _fail(source, field_name, "is not supported with sequence_batching")
    for name in ("batch_input", "batch_output"):
        if getattr(config, name):
            raise _fail(source, name, "is not supported: Plaza has no ragged batching")
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for i, tensor in enumerate(tensors):
            set_fields = {f.name for f, _ in tensor.ListFields()}
            for name, why in _TENSOR_NOT_BUILT.items():
                if name in set_fields:
                    raise _fail(source, f"{kind}[{i}].{name}", f"is not supported: {why}")
            if platform == PLATFORM_ENSEMBLE and "reshape" in set_fields:
                why = "an ensemble hands its tensors to its steps as they are"
                raise _fail(source, f"{kind}[{i}].reshape", f"is not supported: {why}")


def _ensemble_steps(
    config: mc.ModelConfig, platform: str, source: str, name: str
) -> tuple[EnsembleStep, ...]:
    """The checked steps of an ensemble; () for any other model (which may not have any)."""
    scheduling = config.HasField("ensemble_scheduling")
    if platform != PLATFORM_ENSEMBLE:
        if scheduling:
            raise _fail(
                source, "ensemble_scheduling", f'is only for platform "{PLATFORM_ENSEMBLE}"'
            )
        return ()
    steps = tuple(
        EnsembleStep(
            index=i,
            model_name=step.model_name,
            model_version=int(step.model_version),
            input_map=dict(step.input_map),
            output_map=dict(step.output_map),
        )
        for i, step in enumerate(config.ensemble_scheduling.step)
    )
    inputs = [t.name for t in config.input]
    outputs = [t.name for t in config.output]
    check_graph(steps, inputs, outputs, source=source, ensemble=name)
    return steps


_DIMS_REQUIRED = (
    "is required, with at least one dim (a batched tensor of one value a row is "
    "dims: [ 1 ] with reshape: { shape: [ ] })"
)


def _tensor_specs(items: Any, kind: str, source: str, batching: bool) -> tuple[TensorSpec, ...]:
    specs: list[TensorSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(items):
        where = f"{kind}[{i}]"
        if not item.name:
            raise _fail(source, f"{where}.name", "is required")
        if item.name in seen:
            raise _fail(source, f"{where}.name", f"duplicate name {item.name!r}")
        seen.add(item.name)
        if item.data_type == mc.TYPE_INVALID:
            raise _fail(source, f"{where}.data_type", "is required")
        dims = tuple(int(d) for d in item.dims)
        if not dims:
            raise _fail(source, f"{where}.dims", _DIMS_REQUIRED)
        if any(d < -1 or d == 0 for d in dims):
            raise _fail(source, f"{where}.dims", f"{list(dims)}: each dim is -1 or positive")
        type_name = mc.DataType.Name(item.data_type)
        try:
            datatype = from_config_type(type_name)
        except ConfigError as exc:
            raise _fail(source, f"{where}.data_type", exc.message) from exc
        optional = bool(getattr(item, "optional", False))
        reshape = _reshape(item, kind, where, source, batching)
        specs.append(TensorSpec(item.name, datatype, dims, optional, reshape))
    if not specs:
        raise _fail(source, kind, "at least one is required")
    return tuple(specs)


def _reshape(
    item: Any, kind: str, where: str, source: str, batching: bool
) -> tuple[int, ...] | None:
    """A tensor's checked ``reshape.shape`` (None without one). An input goes from dims to
    it, an output from it to dims: the shape reshaped to may hold one -1, and where the
    other is fixed the element counts must be able to agree. Empty only when the model
    batches (Triton's: a model that does not batch has no scalar tensors)."""
    if not item.HasField("reshape"):
        return None
    shape = tuple(int(d) for d in item.reshape.shape)
    if not shape and not batching:
        scalar = "cannot be empty for a model that does not batch (no scalar tensors)"
        raise _fail(source, f"{where}.reshape", scalar)
    if any(d < -1 or d == 0 for d in shape):
        raise _fail(source, f"{where}.reshape", f"{list(shape)}: each dim is -1 or positive")
    dims = tuple(int(d) for d in item.dims)
    origin, target = (dims, shape) if kind == "input" else (shape, dims)
    why = reshaping.consistent(origin, target)
    if why is not None:
        raise _fail(source, f"{where}.reshape", why)
    return shape


def _queue_policy(p: mc.ModelQueuePolicy) -> QueuePolicy:
    return QueuePolicy(
        reject_on_timeout=p.timeout_action == mc.ModelQueuePolicy.REJECT,
        default_timeout_us=int(p.default_timeout_microseconds),
        allow_timeout_override=bool(p.allow_timeout_override),
        max_queue_size=int(p.max_queue_size),
    )


def _batching(config: mc.ModelConfig, source: str) -> DynamicBatching:
    if not config.HasField("dynamic_batching"):
        return DynamicBatching()
    db = config.dynamic_batching
    preferred = tuple(sorted(int(s) for s in db.preferred_batch_size))
    for size in preferred:  # Triton's: positive, and none past max_batch_size (0 takes none)
        if size < 1 or size > config.max_batch_size:
            raise _fail(
                source,
                "dynamic_batching.preferred_batch_size",
                f"{size} must be between 1 and max_batch_size {config.max_batch_size}",
            )
    levels = int(db.priority_levels)
    if levels and not 1 <= db.default_priority_level <= levels:
        raise _fail(source, "dynamic_batching.default_priority_level", f"must be in 1..{levels}")
    per_level = {int(k): _queue_policy(v) for k, v in db.priority_queue_policy.items()}
    if any(not 1 <= k <= levels for k in per_level):
        raise _fail(source, "dynamic_batching.priority_queue_policy", f"levels are 1..{levels}")
    return DynamicBatching(
        enabled=True,
        preferred_batch_sizes=preferred,
        max_queue_delay_us=int(db.max_queue_delay_microseconds),
        priority_levels=levels,
        default_priority_level=int(db.default_priority_level),
        default_queue_policy=_queue_policy(db.default_queue_policy),
        priority_queue_policy=per_level,
    )


def version_policy(config: mc.ModelConfig, source: str) -> VersionPolicy:
    """The checked ``version_policy`` of ``config`` (read from ``source``): latest 1 when
    there is none; ConfigError naming the field for one that can select nothing."""
    if not config.HasField("version_policy"):
        return VersionPolicy(source=source)
    which = config.version_policy.WhichOneof("policy_choice")
    if which == "all":
        return VersionPolicy(kind="all", source=source)
    if which == "specific":
        versions = tuple(int(v) for v in config.version_policy.specific.versions)
        where = "version_policy.specific.versions"
        if not versions:
            raise _fail(source, where, "names no version")
        for version in versions:
            if version < 1:
                raise _fail(source, where, f"{version} is not a version (they start at 1)")
        return VersionPolicy(kind="specific", specific=versions, source=source)
    n = int(config.version_policy.latest.num_versions)
    if n < 1:
        raise _fail(source, "version_policy.latest.num_versions", "must be at least 1")
    return VersionPolicy(kind="latest", latest=n, source=source)


def _response_cache(config: mc.ModelConfig, source: str) -> bool:
    enabled = config.HasField("response_cache") and config.response_cache.enable
    if enabled and config.model_transaction_policy.decoupled:
        raise _fail(source, "response_cache.enable", "a decoupled model cannot cache responses")
    return bool(enabled)


def _instance_groups(config: mc.ModelConfig, source: str) -> tuple[InstanceGroup, ...]:
    groups: list[InstanceGroup] = []
    for i, g in enumerate(config.instance_group):
        resources: list[RateLimitResource] = []
        for j, r in enumerate(g.rate_limiter.resources):
            where = f"instance_group[{i}].rate_limiter.resources[{j}]"
            if not r.name:
                raise _fail(source, f"{where}.name", "is required")
            if r.name in {x.name for x in resources}:
                raise _fail(source, f"{where}.name", f"duplicate resource {r.name!r}")
            resources.append(RateLimitResource(r.name, int(r.count), bool(getattr(r, "global"))))
        groups.append(
            InstanceGroup(
                count=_instance_count(config, i, source),
                kind=mc.ModelInstanceGroup.Kind.Name(g.kind),
                gpus=tuple(int(x) for x in g.gpus),
                resources=tuple(resources),
                priority=max(1, int(g.rate_limiter.priority)),
            )
        )
    return tuple(groups) or (InstanceGroup(),)


def _instance_count(config: mc.ModelConfig, i: int, source: str) -> int:
    """``instance_group[i].count``: 0 is a count left out (proto3 cannot tell the two apart),
    which Triton fills with its default, as Plaza does with 1; a negative count is refused
    (Triton would quietly fill the default in its place too)."""
    count = int(config.instance_group[i].count)
    if count < 0:
        raise _fail(
            source,
            f"instance_group[{i}].count",
            f"{count} instances of model {config.name!r}: must be >= 1 (or left out: 1)",
        )
    return max(1, count)


def _max_concurrency(config: mc.ModelConfig, source: str) -> int:
    raw = (
        config.parameters["max_concurrency"].string_value
        if ("max_concurrency" in config.parameters)
        else "0"
    )
    try:
        value = int(raw or "0")
    except ValueError:
        value = -1
    if value < 0:
        raise _fail(source, "parameters.max_concurrency", f"{raw!r} is not a count >= 0")
    return value


def _fill_in(config: mc.ModelConfig, platform: str) -> None:
    """Fill ``config`` (of a model of ``platform``, as ``_platform`` names it) in as Triton's
    normalized config is, which its config endpoint answers: a platform's backend beside it
    and the other way round (``onnxruntime_onnx`` and ``onnxruntime``, ``pytorch_libtorch``
    and ``pytorch``), an ensemble's ``platform: "ensemble"`` with no backend, a Python
    model's ``backend: "python"``, and the ``default_model_filename`` its backend loads."""
    if platform in _PLATFORM_BACKEND:
        config.platform = platform
        config.backend = _PLATFORM_BACKEND[platform]
    elif platform == BACKEND_PYTHON:
        config.backend = BACKEND_PYTHON
    if not config.default_model_filename:
        config.default_model_filename = DEFAULT_FILENAMES.get(platform, "")


def _fill_instance_groups(config: mc.ModelConfig, platform: str) -> None:
    """Fill ``config``'s instance groups in as Triton's normalized config shows them, after
    they are read (``_instance_groups``: the spec keeps them as written, a negative count
    already refused): one group where there is none, and each group's ``name`` (by default
    ``<model>_<group index>``, the prefix of its Python instances' names), ``kind`` and
    ``count``. ``KIND_AUTO`` (also a kind left out: proto3 cannot tell them apart) is shown
    as ``KIND_CPU``: the gateway does not know the worker's device, and a worker runs on its
    own (``worker.device``) whatever the kind. A count left out is Plaza's 1 (Triton's
    default is 2 for onnxruntime on the CPU). An ensemble has no instances: none is added."""
    if platform == PLATFORM_ENSEMBLE:
        return
    if not config.instance_group:
        config.instance_group.add()
    for i, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{i}"
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            group.kind = mc.ModelInstanceGroup.KIND_CPU
        group.count = max(1, group.count)


def _spec_from_config(config: mc.ModelConfig, *, source: str, default_name: str) -> ModelSpec:
    name = config.name or default_name
    if config.name and config.name != default_name:
        raise _fail(source, "name", f"{config.name!r} does not match its folder {default_name!r}")
    try:
        check_model_name(name)
    except Exception as exc:
        raise _fail(source, "name", str(exc)) from exc
    config.name = name
    if config.max_batch_size < 0:
        raise _fail(source, "max_batch_size", "must be >= 0")
    platform = _platform(config, source)
    _fill_in(config, platform)
    _refuse_unbuilt(config, platform, source)
    batching = config.max_batch_size > 0
    groups = _instance_groups(config, source)
    _fill_instance_groups(config, platform)
    inputs = _tensor_specs(config.input, "input", source, batching)
    outputs = _tensor_specs(config.output, "output", source, batching)
    return ModelSpec(
        name=name,
        platform=platform,
        max_batch_size=int(config.max_batch_size),
        inputs=inputs,
        outputs=outputs,
        batching=_batching(config, source),
        version_policy=version_policy(config, source),
        instance_count=sum(g.count for g in groups),
        default_model_filename=config.default_model_filename or DEFAULT_FILENAMES.get(platform, ""),
        parameters={k: v.string_value for k, v in config.parameters.items()},
        config=config,
        response_cache=_response_cache(config, source),
        instance_groups=groups,
        max_concurrency=_max_concurrency(config, source),
        ensemble_steps=_ensemble_steps(config, platform, source, name),
        sequence=parse_sequence_batching(config, source),
        histogram_buckets=histogram_buckets(config, source),
    )
