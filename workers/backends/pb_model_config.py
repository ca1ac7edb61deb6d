"""``pb_utils.ModelConfig``: what a Python model's ``auto_complete_config`` gets and returns.

Triton's Python backend calls ``TritonPythonModel.auto_complete_config(config)`` once when
the model loads, with the config as written in Triton's JSON form (field names as in
config.pbtxt, 64-bit integers as numbers; ``name``, ``max_batch_size``, ``input`` and
``output`` always there, each tensor with its ``data_type`` and ``dims``). The model adds
what is missing through the methods below and returns the object, which becomes the config.
A method refuses (``ValueError``, as in Triton) what would change what the config already
names, a field at its default included (every field comes printed, as in Triton: a
config's input has ``optional`` false unless it says true, a written
``model_transaction_policy`` has ``decoupled``); giving a tensor again with the same
definition is fine. A tensor's ``dims`` must be a list (or tuple) of ints. Plaza runs the
hook in a process of its own (``python_autocomplete``), never in the worker's or the
gateway's.
"""

from __future__ import annotations

import copy
import json
from numbers import Integral
from typing import Any

_INPUT_KEYS = ("name", "data_type", "dims", "optional")
_OUTPUT_KEYS = ("name", "data_type", "dims")
_OTHER_SCHEDULERS = ("sequence_batching", "ensemble_scheduling")
_UNSET_TYPE = "TYPE_INVALID"


class ModelConfig:
    """The model's config during ``auto_complete_config`` (Triton's class and methods)."""

    def __init__(self, model_config: str | dict[str, Any]) -> None:
        """``model_config``: the config in Triton's JSON form, as text (as Triton passes
        it) or as a dict (copied)."""
        body = json.loads(model_config) if isinstance(model_config, str) else model_config
        body = copy.deepcopy(body)
        for key, default in (("name", ""), ("max_batch_size", 0), ("input", []), ("output", [])):
            body.setdefault(key, default)
        for tensor in (*body["input"], *body["output"]):
            tensor.setdefault("data_type", _UNSET_TYPE)
            tensor.setdefault("dims", [])
        self._model_config: dict[str, Any] = body

    def as_dict(self) -> dict[str, Any]:
        """The config as it stands, a copy: changing it changes nothing (Triton calls it
        read-only; the methods below are how the config changes)."""
        return copy.deepcopy(self._model_config)

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set ``max_batch_size``, as Triton does: a value smaller than the one the config
        names is refused; an equal or larger one replaces it."""
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int):
            raise ValueError(f"{self._where()}: max_batch_size must be an int")
        if max_batch_size < 0:
            raise ValueError(f"{self._where()}: max_batch_size must be >= 0")
        written = int(self._model_config["max_batch_size"])
        if written > max_batch_size:
            raise ValueError(
                f"{self._where()}: the config has max_batch_size {written}, "
                f"auto_complete_config sets a smaller {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Turn on ``dynamic_batching`` (with its defaults) unless it is on already;
        refused when the config chose another scheduler."""
        for scheduler in _OTHER_SCHEDULERS:
            if scheduler in self._model_config:
                raise ValueError(
                    f"{self._where()}: the config schedules with {scheduler}, "
                    "auto_complete_config sets dynamic_batching"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:
        """Add an input (``name``, ``data_type``, ``dims``, optionally ``optional``), or
        complete the one of that name the config has."""
        self._add("input", input, _INPUT_KEYS)

    def add_output(self, output: dict[str, Any]) -> None:
        """Add an output (``name``, ``data_type``, ``dims``), or complete the one of that
        name the config has."""
        self._add("output", output, _OUTPUT_KEYS)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        """Set ``model_transaction_policy`` (its one key, ``decoupled``); refused when the
        config already sets ``decoupled`` otherwise."""
        unknown = sorted(set(transaction_policy_dict) - {"decoupled"})
        if unknown:
            raise ValueError(
                f"{self._where()}: model_transaction_policy has only 'decoupled', not {unknown}"
            )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" not in transaction_policy_dict:
            return
        decoupled = bool(transaction_policy_dict["decoupled"])
        if "decoupled" in policy and bool(policy["decoupled"]) != decoupled:
            raise ValueError(
                f"{self._where()}: the config sets decoupled {policy['decoupled']}, "
                f"auto_complete_config sets {decoupled}"
            )
        policy["decoupled"] = decoupled

    def _where(self) -> str:
        return f"model {self._model_config['name']!r}"

    def _add(self, kind: str, given: dict[str, Any], keys: tuple[str, ...]) -> None:
        tensor = self._checked(kind, given, keys)
        for current in self._model_config[kind]:
            if current.get("name") == tensor["name"]:
                self._complete(kind, current, tensor)
                return
        self._model_config[kind].append(tensor)

    def _checked(self, kind: str, given: Any, keys: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(given, dict):
            raise ValueError(f"{self._where()}: an {kind} is a dict, not {type(given).__name__}")
        name = given.get("name")
        unknown = sorted(set(given) - set(keys))
        if unknown:
            raise ValueError(f"{self._where()}: {kind} {name!r} has {unknown}; allowed: {keys}")
        missing = [k for k in keys if k != "optional" and k not in given]
        if missing:
            raise ValueError(f"{self._where()}: {kind} {name!r} is missing {missing}")
        tensor = dict(given)
        tensor["dims"] = self._dims(kind, name, given["dims"])
        return tensor

    def _dims(self, kind: str, name: Any, dims: Any) -> list[int]:
        """``dims`` as a list of ints; a list or tuple of ints only (not "16", nor [2.7],
        which ``int`` would quietly make something else of)."""
        ints = isinstance(dims, list | tuple) and all(
            isinstance(d, Integral) and not isinstance(d, bool) for d in dims
        )
        if not ints:
            raise ValueError(
                f"{self._where()}: {kind} {name!r} has dims {dims!r}; dims are a list of ints"
            )
        return [int(d) for d in dims]

    def _complete(self, kind: str, current: dict[str, Any], tensor: dict[str, Any]) -> None:
        """Fill in what the config leaves out of its tensor; refuse what it names otherwise."""
        what = f"{self._where()}: {kind} {tensor['name']!r}"
        if current["data_type"] not in (_UNSET_TYPE, tensor["data_type"]):
            raise ValueError(
                f"{what}: the config has data_type {current['data_type']}, "
                f"auto_complete_config gives {tensor['data_type']}"
            )
        if current["dims"] and [int(d) for d in current["dims"]] != tensor["dims"]:
            raise ValueError(
                f"{what}: the config has dims {current['dims']}, "
                f"auto_complete_config gives {tensor['dims']}"
            )
        both = "optional" in current and "optional" in tensor
        if both and bool(current["optional"]) != bool(tensor["optional"]):
            raise ValueError(
                f"{what}: the config has optional {current['optional']}, "
                f"auto_complete_config gives {tensor['optional']}"
            )
        current.update(tensor)
