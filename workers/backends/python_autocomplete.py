"""Triton's ``auto_complete_config`` in a throw-away process.

``python -m plaza.workers.backends.python_autocomplete`` is started by
``plaza.autocomplete_python`` (which reads the repository and never imports model.py). It
reads ``{"model_file": ..., "config": {...}, "timeout_s": ...}`` from stdin (the config as
written, in protobuf's JSON form), loads model.py as the model's own process does
(``python_stub``'s loader, Plaza's ``pb_utils`` under Triton's module name, model.py's folder
first on ``sys.path``), calls ``TritonPythonModel.auto_complete_config`` with a
``pb_utils.ModelConfig`` and writes one JSON answer to stdout: ``{"config": {...}}`` (Triton's
JSON form; null when the class has no such hook) or ``{"error": ..., "traceback": ...}``.
What model.py prints goes to stderr, so it cannot spoil the answer. Nothing made here lives
on: ``initialize`` and ``execute`` run in the model's own process later.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from plaza.modelconfig import int64_as_numbers
from plaza.workers.backends import pb_utils
from plaza.workers.backends.pb_model_config import ModelConfig
from plaza.workers.backends.python_stub import MODULE_NAME, load_module

HOOK = "auto_complete_config"


def complete(request: dict[str, Any]) -> dict[str, Any]:
    """The answer to one request (see the module doc); never raises for model.py's faults."""
    path = Path(request["model_file"])
    body: dict[str, Any] = request["config"]
    int64_as_numbers(body, mc.ModelConfig.DESCRIPTOR)
    body.setdefault("parameters", {})
    sys.modules[MODULE_NAME] = pb_utils
    pb_utils.set_model_loading(None, HOOK)  # as in Triton: no model loading in the hook
    try:
        cls = getattr(load_module(path), "TritonPythonModel", None)
        if cls is None:
            return {"error": f"{path} defines no class TritonPythonModel"}
        hook = getattr(cls, HOOK, None)
        if hook is None:
            return {"config": None}
        returned = hook(ModelConfig(body))
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    if not isinstance(returned, ModelConfig):
        return {
            "error": f"{HOOK} must return a pb_utils.ModelConfig (the one it was given); "
            f"it returned a {type(returned).__name__}"
        }
    return {"config": returned.as_dict()}


def main() -> int:
    request = json.loads(sys.stdin.read())
    limit = float(request.get("timeout_s", 0))
    if limit > 0:  # dies on its own past the limit, should the process that started it go
        signal.alarm(int(limit) + 2)
    answer_to = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # model code's prints (print, or C code writing fd 1) go to stderr
    answer = complete(request)
    try:
        text = json.dumps(answer)
    except (TypeError, ValueError) as exc:  # a value the hook put in is not JSON
        text = json.dumps({"error": f"{HOOK} made a config that is not JSON: {exc}"})
    answer_to.write(text)
    answer_to.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
