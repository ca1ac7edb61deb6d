"""Triton's ``sequence_batching`` block, read into the frozen view the sequence batcher uses.

A stateful model's requests come in sequences: each carries a sequence id and START/END
flags (Triton's request parameters ``sequence_id``, ``sequence_start``, ``sequence_end``).
The block names the control inputs Plaza fills for the model (START, END, READY, CORRID,
each with its false and true values) and the implicit state: inputs Plaza feeds from the
same sequence's previous output (``state``). Either strategy (``direct``, ``oldest``) is
read; Plaza forms batches as ``oldest`` does (``plaza/sequence_batching.py``), which is the
same thing for a model whose state is implicit or carried by its client, since its backends
keep nothing between calls; ``direct``'s ``minimum_slot_utilization`` becomes the preferred
sizes it fills. What Plaza does not carry out is refused with the field named (a CORRID
control of ``TYPE_STRING`` among them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from plaza.datatypes import from_config_type
from plaza.errors import ConfigError

START, END, READY, CORRID = "start", "end", "ready", "corrid"
_KINDS = {
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_START: START,
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_END: END,
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY: READY,
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID: CORRID,
}
DEFAULT_IDLE_US = 1_000_000
"""Triton's default ``max_sequence_idle_microseconds``: a sequence with no request for this
long is released (its state dropped)."""
DEFAULT_MAX_SEQUENCES = 1024
"""Sequences one worker keeps at once for each version it serves, where
``oldest.max_candidate_sequences`` is not set (and always under ``direct``, which has no
such field)."""
DIRECT, OLDEST = "direct", "oldest"
_CORRID_TYPES = (mc.TYPE_UINT64, mc.TYPE_INT64, mc.TYPE_UINT32, mc.TYPE_INT32)


@dataclass(frozen=True, slots=True)
class SequenceControl:
    """A control input: which signal it carries, and as what."""

    name: str
    kind: str
    """start, end, ready or corrid."""
    datatype: str
    false_value: float | int | bool = 0
    true_value: float | int | bool = 1
    """For corrid: unused (the value is the sequence id)."""


@dataclass(frozen=True, slots=True)
class SequenceState:
    """An implicit state: ``input_name`` takes what ``output_name`` gave the sequence last
    (zeros at its START)."""

    input_name: str
    output_name: str
    datatype: str
    dims: tuple[int, ...]
    initial_file: str = ""
    """Triton's ``initial_state { data_file }``: a file of ``<model>/initial_state/`` whose
    raw bytes (row-major) are the state at a START; empty: zeros."""


@dataclass(frozen=True, slots=True)
class SequenceBatching:
    """The block; ``enabled`` False when the config has none."""

    enabled: bool = False
    max_idle_us: int = DEFAULT_IDLE_US
    max_queue_delay_us: int = 0
    preferred_batch_sizes: tuple[int, ...] = ()
    """``oldest.preferred_batch_size``, increasing: a batch of one of these runs before the
    queue delay is out (under ``direct``: every size that fills its
    ``minimum_slot_utilization``)."""
    max_sequences: int = DEFAULT_MAX_SEQUENCES
    """``oldest.max_candidate_sequences``: the sequences a worker holds at once for each
    version (each version of a Triton model has its own sequence batcher); a new one past
    it is refused (``queue_full``)."""
    controls: tuple[SequenceControl, ...] = ()
    states: tuple[SequenceState, ...] = ()
    strategy: str = OLDEST
    """``direct`` or ``oldest``, as the block names it (neither: ``direct``, Triton's
    default); both batch alike here, but only ``oldest`` sets ``max_sequences``."""

    @property
    def max_sequences_field(self) -> str:
        """Where ``max_sequences`` comes from, and how to change it (a ``queue_full``
        message names it)."""
        if self.strategy == OLDEST:
            return "sequence_batching.oldest.max_candidate_sequences"
        return (
            f"Plaza's fixed limit under sequence_batching.{DIRECT}; to change it, use "
            "oldest { max_candidate_sequences } instead"
        )

    @property
    def model_inputs(self) -> tuple[str, ...]:
        """The inputs Plaza fills for the model (not the client's)."""
        return tuple(c.name for c in self.controls) + tuple(s.input_name for s in self.states)

    @property
    def state_outputs(self) -> tuple[str, ...]:
        return tuple(s.output_name for s in self.states)


_fail = ConfigError.at


def parse_sequence_batching(config: mc.ModelConfig, source: str) -> SequenceBatching:
    """The checked block (a disabled one when the config has none)."""
    if not config.HasField("sequence_batching"):
        return SequenceBatching()
    sb = config.sequence_batching
    where = "sequence_batching"
    if config.HasField("dynamic_batching"):
        raise _fail(source, where, "a model has one scheduler: not dynamic_batching as well")
    if config.HasField("response_cache") and config.response_cache.enable:
        raise _fail(
            source, "response_cache.enable", "a stateful model's answers depend on its state"
        )
    if sb.iterative_sequence:
        raise _fail(source, f"{where}.iterative_sequence", "is not supported by Plaza")
    delay, max_sequences = 0, DEFAULT_MAX_SEQUENCES
    preferred: tuple[int, ...] = ()
    if sb.HasField("oldest"):
        oldest = sb.oldest
        delay = int(oldest.max_queue_delay_microseconds)
        if oldest.max_candidate_sequences > 0:
            max_sequences = int(oldest.max_candidate_sequences)
        preferred = _preferred(oldest, config.max_batch_size, source, f"{where}.oldest")
    elif sb.HasField("direct"):
        delay, preferred = _direct(sb.direct, config.max_batch_size, source, f"{where}.direct")
    controls = _controls(sb, source, where)
    states = _states(sb, source, where)
    names = [c.name for c in controls] + [s.input_name for s in states]
    user = {t.name for t in config.input}
    for name in names:
        if name in user:
            raise _fail(source, where, f"{name!r} is also a configured input (Plaza fills it)")
    if len(set(names)) != len(names):
        raise _fail(source, where, f"an input is named twice in {names}")
    outputs = {t.name for t in config.output}
    for s in states:
        if s.output_name in outputs:
            raise _fail(
                source, where, f"state output {s.output_name!r} is also a configured output"
            )
    return SequenceBatching(
        enabled=True,
        max_idle_us=int(sb.max_sequence_idle_microseconds) or DEFAULT_IDLE_US,
        max_queue_delay_us=delay,
        preferred_batch_sizes=preferred,
        max_sequences=max_sequences,
        controls=controls,
        states=states,
        strategy=OLDEST if sb.HasField("oldest") else DIRECT,
    )


def _preferred(oldest: Any, max_batch_size: int, source: str, where: str) -> tuple[int, ...]:
    """``oldest.preferred_batch_size``, increasing: each between 1 and ``max_batch_size``,
    as Triton checks it, so a model that does not batch (0) takes none."""
    preferred = tuple(sorted({int(n) for n in oldest.preferred_batch_size}))
    if preferred and not 1 <= preferred[0] <= preferred[-1] <= max_batch_size:
        raise _fail(
            source,
            f"{where}.preferred_batch_size",
            f"{list(preferred)}: each must be between 1 and max_batch_size ({max_batch_size})",
        )
    return preferred


def _direct(
    direct: Any, max_batch_size: int, source: str, where: str
) -> tuple[int, tuple[int, ...]]:
    """``direct``'s queue delay, and its ``minimum_slot_utilization`` as preferred sizes,
    as Triton's direct batcher uses them: with both set, a batch waits up to the delay
    unless the waiting sequences fill that share of ``max_batch_size`` (so every size from
    there up is preferred); with either unset (0), it runs at once, the delay unused."""
    utilization = np.float32(direct.minimum_slot_utilization)
    if not 0.0 <= utilization <= 1.0:
        raise _fail(source, f"{where}.minimum_slot_utilization", f"{utilization:g}: must be 0 to 1")
    delay = int(direct.max_queue_delay_microseconds)
    if not delay or not utilization:
        return 0, ()
    slots = max(1, max_batch_size)
    # the smallest share that fills it, in Triton's float arithmetic (ready / slots)
    least = next(n for n in range(1, slots + 1) if np.float32(n) / np.float32(slots) >= utilization)
    return delay, tuple(range(least, slots + 1))


def _controls(sb: Any, source: str, where: str) -> tuple[SequenceControl, ...]:
    controls: list[SequenceControl] = []
    for i, ci in enumerate(sb.control_input):
        at = f"{where}.control_input[{i}]"
        if not ci.name:
            raise _fail(source, f"{at}.name", "is required")
        if len(ci.control) != 1:
            raise _fail(source, f"{at}.control", "needs exactly one control per input in Plaza")
        control = ci.control[0]
        kind = _KINDS[control.kind]
        if kind in {c.kind for c in controls}:
            raise _fail(source, f"{at}.control", f"a second {kind.upper()} control")
        controls.append(_control(ci.name, kind, control, source, f"{at}.control[0]"))
    return tuple(controls)


def _control(name: str, kind: str, control: Any, source: str, at: str) -> SequenceControl:
    if kind == CORRID:
        if control.data_type not in _CORRID_TYPES:
            # Triton also takes TYPE_STRING (string sequence ids); Plaza passes the id as a
            # number only, and checks each request's id against this type
            raise _fail(
                source,
                f"{at}.data_type",
                f"{_type_name(control.data_type)}: a CORRID control is TYPE_UINT64, "
                "TYPE_INT64, TYPE_UINT32 or TYPE_INT32 in Plaza (TYPE_STRING is not supported)",
            )
        return SequenceControl(name, kind, _datatype(control.data_type, source, at))
    given = [
        (f, list(getattr(control, f)))
        for f in ("int32_false_true", "fp32_false_true", "bool_false_true")
        if getattr(control, f)
    ]
    if len(given) != 1 or len(given[0][1]) != 2:
        raise _fail(source, at, "needs one of int32/fp32/bool_false_true, with two values")
    field, (false_value, true_value) = given[0]
    datatype = {"int32_false_true": "INT32", "fp32_false_true": "FP32"}.get(field, "BOOL")
    return SequenceControl(name, kind, datatype, false_value, true_value)


def _states(sb: Any, source: str, where: str) -> tuple[SequenceState, ...]:
    states: list[SequenceState] = []
    for i, st in enumerate(sb.state):
        at = f"{where}.state[{i}]"
        if not st.input_name or not st.output_name:
            raise _fail(source, at, "needs input_name and output_name")
        dims = tuple(int(d) for d in st.dims)
        if not dims or any(d < 1 for d in dims):
            raise _fail(source, f"{at}.dims", f"{list(dims)}: Plaza needs fixed positive dims")
        if st.use_growable_memory:
            raise _fail(source, f"{at}.use_growable_memory", "is not supported by Plaza")
        datatype = _datatype(st.data_type, source, f"{at}.data_type")
        if datatype == "BYTES":
            raise _fail(source, f"{at}.data_type", "a state is a numeric tensor in Plaza")
        initial = _initial_file(st, datatype, dims, source, at)
        states.append(SequenceState(st.input_name, st.output_name, datatype, dims, initial))
    return tuple(states)


def _initial_file(st: Any, datatype: str, dims: tuple[int, ...], source: str, at: str) -> str:
    """The state's ``initial_state`` data file ("" for none, or ``zero_data``): at most one
    entry, of the state's own type and dims, naming a file of ``initial_state/``."""
    if not st.initial_state:
        return ""
    if len(st.initial_state) > 1:
        raise _fail(source, f"{at}.initial_state", "takes one entry in Plaza")
    init, where = st.initial_state[0], f"{at}.initial_state[0]"
    if init.data_type and _datatype(init.data_type, source, f"{where}.data_type") != datatype:
        raise _fail(source, f"{where}.data_type", f"must be the state's own, {datatype}")
    if init.dims and tuple(int(d) for d in init.dims) != dims:
        raise _fail(source, f"{where}.dims", f"must be the state's own, {list(dims)}")
    if init.WhichOneof("state_data") != "data_file":
        return ""  # zero_data, or nothing: zeros
    name = init.data_file
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        raise _fail(source, f"{where}.data_file", f"{name!r} is not a file name")
    return str(name)


def _type_name(value: int) -> str:
    return mc.DataType.Name(value) if value in mc.DataType.values() else str(value)


def _datatype(value: int, source: str, at: str) -> str:
    try:
        return from_config_type(mc.DataType.Name(value))
    except (ConfigError, ValueError) as exc:
        raise _fail(source, at, f"is not a data type Plaza knows: {exc}") from exc
