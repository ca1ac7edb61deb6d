"""PyTorch backend (platform pytorch_libtorch): a TorchScript ``model.pt``.

TorchScript archives load with ``torch.jit.load``, which runs no arbitrary pickled Python.
Inputs are passed positionally and outputs taken by position, matched to the config's
names by Triton's libtorch conventions (``torch_names``: forward's argument names,
``<name>__<index>``, or config order). A stateful model (``sequence_batching``) takes its
control inputs after the config's inputs, in the order the config lists them, then its
state inputs, and returns its state outputs after its outputs. This module is imported only
for torch models.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import numpy as np
import torch

from plaza.errors import ConfigError, ModelExecutionError
from plaza.repository import ModelVersion
from plaza.workers.backends.base import Arrays
from plaza.workers.backends.torch_names import argument_order, result_order
from plaza.workers.device import Device

log = logging.getLogger(__name__)


class TorchBackend:
    """One TorchScript module in eval + inference mode."""

    def __init__(self, mv: ModelVersion, device: Device, threads: int) -> None:
        self.mv = mv
        self.device = device
        self.threads = threads
        self._module: Any = None
        self._torch_device = torch.device("cpu")
        self._inputs: list[str] = []
        """The input names in forward's argument order (known once loaded)."""
        sequence = mv.spec.sequence
        self._results = result_order(
            mv.spec.name, [s.name for s in mv.spec.outputs], list(sequence.state_outputs)
        )
        """Each output's position among forward's results."""

    def load(self) -> None:
        if self.device.kind == "cuda":
            self._torch_device = _cuda_device(self.mv, self.device)
        else:
            torch.set_num_threads(self.threads)
        try:
            with warnings.catch_warnings():  # torch.jit announces its deprecation on load
                warnings.filterwarnings("ignore", message=r".*torch\.jit\.load. is deprecated")
                module = torch.jit.load(  # type: ignore[no-untyped-call]
                    str(self.mv.path), map_location=self._torch_device
                )
        except Exception as exc:
            raise ConfigError(
                f"{self.mv.path}: torch.jit.load failed: {exc}", file=str(self.mv.path)
            ) from exc
        module.eval()
        spec = self.mv.spec
        self._inputs = argument_order(
            spec.name,
            [s.name for s in spec.inputs],
            list(spec.sequence.model_inputs),
            _forward_args(module),
        )
        self._module = module
        log.info(
            "%s v%d loaded on %s (torch %s)",
            self.mv.spec.name,
            self.mv.version,
            self._torch_device,
            torch.__version__,
        )

    def infer(self, inputs: Arrays, outputs: list[str]) -> Arrays:
        if self._module is None:
            raise RuntimeError("backend not loaded")
        args = [self._tensor(inputs[name]) for name in self._inputs]
        with torch.inference_mode():
            raw = self._module(*args)
        values = raw if isinstance(raw, tuple | list) else (raw,)
        arrays: Arrays = {}
        for name in outputs:
            place = self._results[name]
            if place >= len(values):
                raise ModelExecutionError(
                    f"{self.mv.spec.name}: output {name!r} is forward's result {place}, and "
                    f"forward returned {len(values)}"
                )
            arrays[name] = values[place].detach().cpu().numpy()
        return arrays

    def _tensor(self, array: np.ndarray[Any, Any]) -> torch.Tensor:
        # Zero-copy views over a request are read-only; torch wants writable memory.
        if not array.flags.writeable:
            array = array.copy()
        # np.require keeps a 0-d input 0-d (np.ascontiguousarray makes it shape [1]).
        return torch.from_numpy(np.require(array, requirements="C")).to(self._torch_device)

    def unload(self) -> None:
        self._module = None
        if self._torch_device.type == "cuda":
            torch.cuda.empty_cache()


def _cuda_device(mv: ModelVersion, device: Device) -> torch.device:
    """Torch's device for the GPU ``device``; a ConfigError (``bad_config``) when this torch
    cannot use CUDA, as the worker refuses ``cuda`` without a GPU: a model on a GPU worker
    never runs slowly on the CPU instead."""
    if not torch.cuda.is_available():
        cuda = torch.version.cuda
        why = (
            "was built without CUDA; install a CUDA build"
            if cuda is None
            else f"(CUDA {cuda}) cannot use the GPU; check its driver"
        )
        raise ConfigError(
            f"{mv.spec.name}: worker device is {device}, but torch {torch.__version__} "
            f"{why} or set worker.device=cpu",
            file=str(mv.path),
        )
    return torch.device(f"cuda:{device.index}")


def _forward_args(module: Any) -> list[str] | None:
    """The names of ``forward``'s arguments, ``self`` left out; None where the module does
    not say (then no input can match one by name)."""
    try:
        arguments = module.forward.schema.arguments
    except (AttributeError, RuntimeError):
        return None
    return [a.name for a in arguments if a.name != "self"]
