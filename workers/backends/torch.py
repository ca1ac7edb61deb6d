"""PyTorch backend (platform pytorch_libtorch): a TorchScript ``model.pt``.

TorchScript archives load with ``torch.jit.load``, which runs no arbitrary pickled Python.
Inputs are passed positionally in config order and outputs taken in config order, as
Triton's libtorch backend does. A stateful model (``sequence_batching``) takes its control
inputs next, in the order the config lists them, then its state inputs, and returns its
state outputs after its outputs. This module is imported only for torch models.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import numpy as np
import torch

from plaza.errors import ConfigError
from plaza.repository import ModelVersion
from plaza.workers.backends.base import Arrays
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
        sequence = mv.spec.sequence
        self._inputs = [s.name for s in mv.spec.inputs] + list(sequence.model_inputs)
        self._outputs = [s.name for s in mv.spec.outputs] + list(sequence.state_outputs)

    def load(self) -> None:
        if self.device.kind == "cuda" and torch.cuda.is_available():
            self._torch_device = torch.device(f"cuda:{self.device.index}")
        elif self.device.kind == "cuda":
            log.warning(
                "%s: GPU visible but this torch has no CUDA; running on cpu", self.mv.spec.name
            )
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
        by_name = dict(zip(self._outputs, values, strict=False))
        return {name: by_name[name].detach().cpu().numpy() for name in outputs}

    def _tensor(self, array: np.ndarray[Any, Any]) -> torch.Tensor:
        # Zero-copy views over a request are read-only; torch wants writable memory.
        if not array.flags.writeable:
            array = array.copy()
        return torch.from_numpy(np.ascontiguousarray(array)).to(self._torch_device)

    def unload(self) -> None:
        self._module = None
        if self._torch_device.type == "cuda":
            torch.cuda.empty_cache()
